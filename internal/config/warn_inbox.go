package config

import (
	"fmt"
	"slices"

	"github.com/outbox-cdc/outbox-cdc/router"
)

// inboxIDWarnings warns for each outbox table whose plain records would
// carry no "id" header (outbox.standard_headers without id): inbox
// consumers then key their dedupe on topic/partition/offset, so the copies a
// replay or a verify --repair publishes are processed again, and verify
// cannot match the records either. CloudEvents records carry the id as an
// attribute, which the inbox reads, so they do not warn.
func (c *Config) inboxIDWarnings() []FieldError {
	var out []FieldError
	for i, tc := range c.PerTable() {
		ob := tc.Outbox
		if ob.StandardHeaders == nil || slices.Contains(ob.StandardHeaders, "id") || tc.Kafka.Format != router.FormatPlain {
			continue
		}
		key := "outbox.standard_headers"
		if len(c.Outbox.Tables) > 0 && c.Outbox.Tables[i].StandardHeaders != nil {
			key = fmt.Sprintf("outbox.tables[%d].standard_headers", i)
		}
		if slices.ContainsFunc(out, func(e FieldError) bool { return e.Key == key }) {
			continue
		}
		out = append(out, FieldError{Key: key, Problem: "records of " + ob.Table + " carry no id header: inbox consumers " +
			"deduplicate them by topic/partition/offset, so events a replay or verify --repair publishes again are " +
			"processed again; keep id in the list, or place the id column in another header (outbox.fields) and set " +
			"inbox.Config.IDHeader"})
	}
	return out
}
