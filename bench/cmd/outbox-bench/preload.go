package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// preloaders is how many sessions commit the preload in parallel (one per core).
const preloaders = 2

// preload commits events rows into the outbox, txSize rows per transaction,
// with server-side loops: a DO block that COMMITs after every txSize rows, so
// one-row transactions really are separate commits without a client round
// trip each. Sequence numbers are 0..events-1.
func (e *env) preload(ctx context.Context, aggType string, events, txSize int) error {
	txns := events / txSize
	gctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for w := range preloaders {
		// Loader w commits transactions [lo, hi) of txns.
		lo, hi := txns*w/preloaders, txns*(w+1)/preloaders
		if lo == hi {
			continue
		}
		wg.Go(func() {
			if err := e.preloadRange(gctx, aggType, lo*txSize, hi*txSize-1, txSize); err != nil {
				cancel() // the other loader stops too
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (e *env) preloadRange(ctx context.Context, aggType string, first, last, txSize int) error {
	conn, err := pgx.Connect(ctx, e.dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, preloadSQL(aggType, first, last, txSize)); err != nil {
		return fmt.Errorf("preload %d..%d: %w", first, last, err)
	}
	return nil
}

func preloadSQL(aggType string, first, last, txSize int) string {
	q := strings.NewReplacer("'", "''")
	return fmt.Sprintf(`DO $bench$
BEGIN
  FOR b IN %[1]d..%[2]d BY %[3]d LOOP
    INSERT INTO %[4]s (id, aggregate_type, aggregate_id, event_type, payload)
      SELECT ('%[5]s' || lpad(to_hex(i), 12, '0'))::uuid, '%[6]s', 'agg-' || (i %% %[7]d), 'OrderPlaced',
             ('{"seq":' || i || ',' || '%[8]s')::jsonb
      FROM generate_series(b, b + %[3]d - 1) AS i;
    COMMIT;
  END LOOP;
END
$bench$`, first, last, txSize, outboxTable, idPrefix, q.Replace(aggType), aggregates, q.Replace(payloadJSON))
}

// timed runs f and returns how long it took.
func timed(f func() error) (time.Duration, error) {
	t := time.Now()
	err := f()
	return time.Since(t), err
}
