package topicread

import (
	"context"
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
