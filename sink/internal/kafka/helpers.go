package kafka

import (
	"github.com/twmb/franz-go/pkg/kgo"
)

// Header is the value of rec's first header named key, "" without one.
func Header(rec *kgo.Record, key string) string {
	for _, h := range rec.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// SourceKey names one source (the cluster's system identifier, the
// database and the slot) in the keys of the connector's compacted topics:
// the positions topic and the quarantine state topic.
func SourceKey(systemID, database, slot string) string {
	return systemID + "/" + database + "/" + slot
}
