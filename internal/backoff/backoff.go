// Package backoff is the one way the connector waits between attempts: a
// doubling wait with a cap, jitter for clients that retry together, and a
// sleep that ends with its context. Both the PostgreSQL and the Kafka side
// use it.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Nth is the nth wait (from 0) of a doubling backoff: first, then twice as
// long each time, at most most.
func Nth(first, most time.Duration, n int) time.Duration {
	d := first
	for ; n > 0 && d < most; n-- {
		d *= 2
	}
	return min(d, most)
}

// Jitter is d/2 plus a random part of at most d/2: clients retrying
// together spread out.
func Jitter(d time.Duration) time.Duration { return d/2 + rand.N(d/2+1) }

// Sleep waits for d or until ctx ends; the caller looks at ctx.
func Sleep(ctx context.Context, d time.Duration) {
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
	case <-ctx.Done():
	}
}
