package kafka

import (
	"context"
	"math/rand/v2"
	"time"

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

// Sleep waits for d or until ctx ends (a Close); the caller looks at ctx.
func Sleep(ctx context.Context, d time.Duration) {
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
	case <-ctx.Done():
	}
}

// Backoff is the nth wait (from 0) of a doubling backoff: first, then
// twice as long each time, at most most.
func Backoff(first, most time.Duration, n int) time.Duration {
	d := first
	for ; n > 0 && d < most; n-- {
		d *= 2
	}
	return min(d, most)
}

// Jitter is d/2 plus a random part of at most d/2: clients retrying
// together spread out.
func Jitter(d time.Duration) time.Duration { return d/2 + rand.N(d/2+1) }

// SourceKey names one source (the cluster's system identifier, the
// database and the slot) in the keys of the connector's compacted topics:
// the positions topic and the quarantine state topic.
func SourceKey(systemID, database, slot string) string {
	return systemID + "/" + database + "/" + slot
}
