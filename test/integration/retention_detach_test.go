package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/replication"
)

// TestRetentionKillInDetach: a kill -9 of the connector while it detaches
// an expired, delivered partition (DETACH PARTITION … CONCURRENTLY waits in
// its second transaction for the partition's ACCESS EXCLUSIVE lock, which
// another session's ACCESS SHARE lock holds back) with writers committing
// all along. What the kill leaves depends on the server: with
// client_connection_check_interval its backend notices the lost client
// while it waits and ends, leaving the partition "detach pending" (the
// restarted connector finalizes it); without, the backend completes the
// detach once the lock is released, leaving a detached table with the
// connector's mark (the restarted connector drops it). Either way the
// restarted connector drops it and the next one, expired meanwhile (while
// a partition is pending detach PostgreSQL refuses to detach another
// concurrently), no partition stays detach-pending, no
// partition went before its rows' events were appended, and every event
// is in Kafka.
func TestRetentionKillInDetach(t *testing.T) {
	t.Run("the server ends the detach with the session", func(t *testing.T) { killInDetach(t, true) })
	t.Run("the server completes the detach", func(t *testing.T) { killInDetach(t, false) })
}

// killInDetach runs TestRetentionKillInDetach; checkClient sets the
// database's client_connection_check_interval.
func killInDetach(t *testing.T, checkClient bool) {
	dsn := newDatabase(t)
	conn := pgConnect(t, dsn)
	if major := queryInt(t, conn, "SELECT current_setting('server_version_num')::int / 10000"); major < 14 {
		t.Skipf("PostgreSQL %d has no DETACH PARTITION … CONCURRENTLY", major)
	}
	partitionedOutbox(t, dsn)
	if checkClient {
		exec1(t, dsn, `DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET client_connection_check_interval = ''100ms''', current_database()); END $$`)
	}
	slot := "retdetach"
	if checkClient {
		slot += "c"
	}
	aggType := slot + runID
	appendTimeTopic(t, topicFor(aggType))
	const width, retain = 2 * time.Second, 3 * time.Second
	cfgPath := retentionYAML(t, dsn, slot, fmt.Sprintf("retention: %s, partition_width: %s, partitions_ahead: 2", retain, width), "")
	marked := func() int {
		return queryInt(t, conn, `SELECT count(*) FROM pg_description WHERE classoid = 'pg_class'::regclass AND description LIKE 'outbox-cdc partition of %'`)
	}
	p := startRetention(t, cfgPath)
	waitFor(t, 30*time.Second, "partitions made ahead", func() bool { return marked() >= 3 })
	w := startWriter(t, dsn, "outbox", aggType)

	// The partition of a row committed now: held by a lock from now on.
	var id string
	var at time.Time
	if err := conn.QueryRow(context.Background(), `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		VALUES ($1, 't', 'E', '{}') RETURNING id::text, created_at`, aggType).Scan(&id, &at); err != nil {
		t.Fatal(err)
	}
	target := replication.PartitionName("outbox", at.Truncate(width))
	release := holdPartition(t, dsn, target)
	pid := waitInDetach(t, conn, target)
	if n := queryInt(t, conn, "SELECT count(*) FROM dropped WHERE name = $1", target); n != 0 {
		t.Fatalf("%s dropped while its detach waits", target)
	}
	p.kill()
	gone := func() bool {
		return queryInt(t, conn, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid) == 0
	}
	if checkClient {
		waitFor(t, 30*time.Second, "the killed connector's session ended by the server", gone)
		if detachPending(t, conn, target) != 1 {
			t.Fatalf("%s is not detach pending after the kill", target)
		}
		release()
	} else {
		release()
		waitFor(t, 30*time.Second, "the killed connector's session ended", gone)
		if n := queryInt(t, conn, "SELECT count(*) FROM pg_inherits WHERE inhrelid = to_regclass($1)", target); n != 0 {
			t.Fatalf("%s still attached after its orphaned detach ended", target)
		}
	}
	if n := queryInt(t, conn, "SELECT count(*) FROM dropped WHERE name = $1", target); n != 0 {
		t.Fatalf("%s dropped before the restart", target)
	}
	// The restart finds the next partition past the retention too: while
	// one is pending, PostgreSQL refuses to detach another concurrently.
	next := replication.PartitionName("outbox", at.Truncate(width).Add(width))
	time.Sleep(time.Until(at.Truncate(width).Add(2*width + retain))) // a clock, not a state, to wait for

	p = startRetention(t, cfgPath)
	waitFor(t, time.Minute, target+" and "+next+" dropped by the restarted connector", func() bool {
		return queryInt(t, conn, "SELECT count(*) FROM dropped WHERE name IN ($1, $2)", target, next) == 2
	})
	waitFor(t, 30*time.Second, "no partition detach pending", func() bool { return detachPending(t, conn, "") == 0 })
	p.waitMetric(t, 10*time.Second, "outbox_cdc_outbox_partitions_dropped_total", 1)
	ids := append(w.stop(t), id)
	w.created[id] = at
	end := currentLSN(t, conn)
	waitFor(t, time.Minute, "every event acknowledged", func() bool { return slotConfirmed(t, dsn, slot) >= end })
	stopClean(t, p)

	// The kill's resent copies count too: read on a second past the count.
	recs := consumeN(t, []string{topicFor(aggType)}, len(ids), time.Minute, time.Second)
	checkDeletedAfterAck(t, conn, recs, ids) // 0 lost; partitions are dropped, no row deleted
	dropAt := droppedTables(t, conn)
	checkDroppedAfterAck(t, recs, w.created, dropAt, width)
	t.Logf("%d rows; %d partitions dropped; killed inside the detach of %s", len(ids), len(dropAt), target)
}

// holdPartition holds an ACCESS SHARE lock on the partition name in an
// open transaction until release (or the test's end): DETACH … CONCURRENTLY
// commits its first transaction and then waits in its second for the
// partition's ACCESS EXCLUSIVE lock.
func holdPartition(t *testing.T, dsn, name string) (release func()) {
	t.Helper()
	tx, err := pgConnect(t, dsn).Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(context.Background(), "LOCK TABLE "+pgx.Identifier{name}.Sanitize()+" IN ACCESS SHARE MODE"); err != nil {
		t.Fatal(err)
	}
	release = func() {
		if tx != nil {
			if err := tx.Rollback(context.Background()); err != nil {
				t.Fatal(err)
			}
			tx = nil
		}
	}
	t.Cleanup(release)
	return release
}

// waitInDetach waits until a session detaches the partition name: its
// first transaction committed (the partition is detach pending) and the
// session waits for a lock in the second; it returns the session's pid.
func waitInDetach(t *testing.T, conn *pgx.Conn, name string) int {
	t.Helper()
	var pid int
	waitFor(t, time.Minute, "a detach of "+name+" waiting for its lock", func() bool {
		err := conn.QueryRow(context.Background(), `SELECT pid FROM pg_stat_activity WHERE pid <> pg_backend_pid()
			AND query LIKE '%DETACH PARTITION%CONCURRENTLY%' AND position($1 in query) > 0 AND wait_event_type = 'Lock'`, name).Scan(&pid)
		return err == nil && detachPending(t, conn, name) == 1
	})
	return pid
}

// detachPending counts the partitions of public.outbox pending detach:
// name's, or all when name is "".
func detachPending(t *testing.T, conn *pgx.Conn, name string) int {
	t.Helper()
	return queryInt(t, conn, `SELECT count(*) FROM pg_inherits WHERE inhparent = 'outbox'::regclass AND inhdetachpending
		AND ($1 = '' OR inhrelid = to_regclass($1))`, name)
}
