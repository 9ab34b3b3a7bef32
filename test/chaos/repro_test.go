package chaos

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestFastShutdownDuringKafkaOutage: PostgreSQL's fast shutdown ends a
// logical walsender only once the client's flush position (or its write
// position, when flush is reported as invalid) reaches what was sent
// (walsender.c, WalSndDone). outbox-cdc confirms only what Kafka
// acknowledged; it reports flush only when it moved, so a fast stop must
// complete while the broker is down.
func TestFastShutdownDuringKafkaOutage(t *testing.T) {
	if env.skip != "" {
		t.Skip(env.skip)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	r := &run{t: t, m: shortMode, ledger: &ledger{}, wstats: &writerStats{}, live: newLiveConsumer(), workers: make(chan error, 1)}
	r.setup(ctx)
	if _, err := r.conn.start(ctx, "initial"); err != nil {
		t.Fatalf("start connector: %v", err)
	}
	w := newWriter(0, r.dsn, []*aggregate{{id: "a", typ: "order", next: 1}}, 0, 1, r.ledger, r.wstats)
	stopW := make(chan struct{})
	var wg sync.WaitGroup
	var werr error
	wg.Go(func() { werr = w.run(ctx, stopW, 10*time.Millisecond) })
	stopWriter := sync.OnceFunc(func() { close(stopW); wg.Wait() })
	defer stopWriter()
	// Events flow before the outage: Kafka has acknowledged some.
	r.waitMetric(ctx, "outbox_cdc_events_published_total", 20)

	if err := env.kafka.Kill(); err != nil {
		t.Fatalf("kill kafka: %v", err)
	}
	kafkaRestarted := false
	defer func() { // a failure below must not leave the broker down for the next test
		if !kafkaRestarted {
			_ = restartKafka(context.Background())
		}
	}()
	// Events committed now stay in flight: the writer commits more, and the
	// connector holds at least as many events it cannot deliver.
	mark := r.ledger.len()
	waitUntil(ctx, t, "10 events committed after the broker was killed", func() bool { return r.ledger.len() >= mark+10 })
	r.waitMetric(ctx, "outbox_cdc_inflight_events", 10)
	stopWriter()
	if werr != nil {
		t.Fatalf("writer: %v", werr)
	}

	stopStart := time.Now()
	stopped := make(chan error, 1)
	go func() {
		sctx, scancel := context.WithTimeout(ctx, 2*time.Minute)
		defer scancel()
		stopped <- env.pg.Stop(sctx)
	}()
	const patience = 15 * time.Second
	var blocked bool
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatalf("pg stop: %v", err)
		}
	case <-time.After(patience): // the bound under test: a fast stop that takes longer is blocked
		blocked = true
	}
	kafkaRestarted = true
	if err := restartKafka(ctx); err != nil {
		t.Fatalf("restart kafka: %v", err)
	}
	kafkaBack := time.Now()
	if blocked {
		err := <-stopped
		t.Errorf("PostgreSQL fast shutdown (SIGINT) blocked for %v, until Kafka was back: it completed %v after the broker was ready again (err %v); "+
			"the connector had events in flight and could not confirm the walsender's last position",
			time.Since(stopStart).Round(100*time.Millisecond), time.Since(kafkaBack).Round(100*time.Millisecond), err)
	} else {
		t.Logf("fast shutdown took %v with Kafka down", time.Since(stopStart))
	}
	rctx, rcancel := context.WithTimeout(ctx, 2*time.Minute)
	defer rcancel()
	if err := env.pg.Restart(rctx); err != nil {
		t.Fatalf("restart postgres: %v", err)
	}
}

// waitMetric waits until the connector's unlabelled metric name is at least
// min, for a minute at most.
func (r *run) waitMetric(ctx context.Context, name string, min float64) {
	r.t.Helper()
	waitUntil(ctx, r.t, fmt.Sprintf("%s >= %v", name, min), func() bool {
		v, err := r.conn.metric(name)
		return err == nil && v >= min
	})
}

// waitUntil polls cond, which reads a real state, until it holds; it fails
// the test after a minute or when ctx ends.
func waitUntil(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for !cond() {
		if !sleepCtx(ctx, 20*time.Millisecond) { // poll interval: cond reads the real state again
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		}
	}
}
