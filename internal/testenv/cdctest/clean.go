package cdctest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
)

// DropSlot drops replication slot slot once no walsender holds it (a
// connector just stopped may still be going away) and returns once it is
// gone; a slot that never existed is no error. It gives up when ctx ends.
// Slots are cluster-wide and pin WAL, so they must not outlive a test.
func DropSlot(ctx context.Context, conn *pgx.Conn, slot string) error {
	last := errors.New("no answer from the server")
	for {
		// Dropping only an inactive slot in the same statement leaves no
		// window for a walsender to take it between a check and the drop.
		_, err := conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
			WHERE slot_name = $1 AND NOT active`, slot)
		var left bool
		if err == nil {
			err = conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)`, slot).Scan(&left)
		}
		if err == nil && !left {
			return nil
		}
		switch {
		case err == nil:
			last = errors.New("still active")
		case ctx.Err() == nil:
			last = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("drop slot %s: %w (%w)", slot, last, ctx.Err())
		case <-time.After(100 * time.Millisecond): // poll interval of pg_replication_slots
		}
	}
}

// DeleteTopics deletes topics; the error names every topic that failed.
func DeleteTopics(ctx context.Context, adm *kadm.Client, topics ...string) error {
	resps, err := adm.DeleteTopics(ctx, topics...)
	if err == nil {
		err = resps.Error()
	}
	if err != nil {
		return fmt.Errorf("delete topics %v: %w", topics, err)
	}
	return nil
}
