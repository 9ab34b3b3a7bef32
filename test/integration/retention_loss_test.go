package integration

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv/cdctest"
)

// Retention deletes a row only when its event is proven in Kafka (issue
// 35): rows the stream never decoded (the outbox outside the publication
// while the connector was stopped, a lost slot, another slot behind) stay
// until they are published.

// TestRetentionPublicationFlapWhileStopped: the outbox leaves the
// publication, or is dropped and created again, while the connector is
// stopped; rows written meanwhile are never decoded. The start finds the
// publication changed since the checkpoint, repairs the gap from the table,
// and retention deletes each row only after its event is in Kafka.
func TestRetentionPublicationFlapWhileStopped(t *testing.T) {
	t.Run("removed from the publication and added again", func(t *testing.T) {
		flapWhileStopped(t, "retflap", func(t *testing.T, dsn string, conn *pgx.Conn, okType, gapType string) []string {
			exec1(t, dsn, "ALTER PUBLICATION retflap DROP TABLE outbox")
			ids := insertRows(t, conn, "outbox", gapType, 5)
			exec1(t, dsn, "ALTER PUBLICATION retflap ADD TABLE outbox")
			return append(ids, insertRows(t, conn, "outbox", okType, 2)...)
		})
	})
	t.Run("dropped and created again", func(t *testing.T) {
		flapWhileStopped(t, "retflapdrop", func(t *testing.T, dsn string, conn *pgx.Conn, okType, gapType string) []string {
			exec1(t, dsn, "DROP TABLE outbox")
			retentionTable(t, dsn, "outbox")
			ids := insertRows(t, conn, "outbox", gapType, 5)
			exec1(t, dsn, "ALTER PUBLICATION retflapdrop ADD TABLE outbox")
			return append(ids, insertRows(t, conn, "outbox", okType, 2)...)
		})
	})
}

// flapWhileStopped runs TestRetentionPublicationFlapWhileStopped: change
// alters the outbox while the connector is stopped and returns the ids of
// the rows it wrote (gapType's written outside the publication).
func flapWhileStopped(t *testing.T, slot string, change func(t *testing.T, dsn string, conn *pgx.Conn, okType, gapType string) []string) {
	dsn := newDatabase(t)
	retentionTable(t, dsn, "outbox")
	okType, gapType := slot+"ok"+runID, slot+"gap"+runID
	topics := []string{topicFor(okType), topicFor(gapType)}
	for _, tp := range topics {
		appendTimeTopic(t, tp)
	}
	const retain = 3 * time.Second
	cfgPath := retentionYAML(t, dsn, slot, "retention: "+retain.String(), "")
	conn := pgConnect(t, dsn)
	p := startRetention(t, cfgPath)
	ids := insertRows(t, conn, "outbox", okType, 10)
	waitFor(t, time.Minute, "the delivered rows deleted", func() bool {
		return queryInt(t, conn, "SELECT count(*) FROM deleted_rows") == len(ids)
	})
	stopClean(t, p)

	ids = append(ids, change(t, dsn, conn, okType, gapType)...)
	p = startRetention(t, cfgPath)
	waitFor(t, 2*time.Minute, "every row deleted", func() bool { return queryInt(t, conn, "SELECT count(*) FROM outbox") == 0 })
	stopClean(t, p)
	if !strings.Contains(p.output(), "published the rows written while the outbox was outside the publication") {
		t.Errorf("the restart did not repair the gap from the table:\n%s", p.output())
	}
	recs := readIDs(t, topics, ids, 30*time.Second)
	if n := checkDeletedAfterAck(t, conn, recs, ids); n != len(ids) {
		t.Errorf("%d rows deleted, want %d", n, len(ids))
	}
}

// TestRetentionBackdatedAfterLostSlot: rows committed between the last
// checkpoint and the new slot's creation are held by transaction id, not
// by created_at: an application-set created_at two days back does not let
// retention delete them. verify --repair with a --since after those
// created_at republishes them too and clears the hold.
func TestRetentionBackdatedAfterLostSlot(t *testing.T) {
	const slot, retain = "retback", 2 * time.Second
	dsn, conn, aggType, cfgPath := retentionSetup(t, slot, retain)
	p := startRetention(t, cfgPath)
	delivered := deliverAndStop(t, conn, p, aggType)

	dropStoppedSlot(t, dsn, slot)
	since := time.Now().Add(-time.Minute) // after the backdated rows' created_at
	backdated := insertBackdated(t, conn, aggType, 5, "2 days")
	lost := insertRows(t, conn, "outbox", aggType, 5)
	p = startRetention(t, cfgPath) // creates the slot again
	later := insertRows(t, conn, "outbox", aggType, 5)
	consumeN(t, []string{topicFor(aggType)}, len(delivered)+len(later), time.Minute, 0)
	time.Sleep(3 * retain) // rounds on the new slot past the later rows
	if !strings.Contains(p.output(), "--repair") {
		t.Errorf("the connector that created the slot again printed no repair command:\n%s", p.output())
	}
	if n := countIDs(t, conn, backdated); n != len(backdated) {
		t.Errorf("%d of the %d backdated rows the lost slot never delivered deleted before verify --repair", len(backdated)-n, len(backdated))
	}
	if n := countIDs(t, conn, lost); n != len(lost) {
		t.Errorf("%d of the %d rows the lost slot never delivered deleted before verify --repair", len(lost)-n, len(lost))
	}

	verifyClears(t, cfgPath, nil, since)
	waitFor(t, time.Minute, "every row deleted once the hold is lifted", func() bool {
		return queryInt(t, conn, "SELECT count(*) FROM outbox") == 0
	})
	stopClean(t, p)
	ids := concat(delivered, backdated, lost, later)
	recs := readIDs(t, []string{topicFor(aggType)}, ids, 30*time.Second)
	checkDeletedAfterAck(t, conn, recs, ids)
}

// TestRetentionHoldSurvivesCheckpointForget: a lost slot's hold outlives
// the checkpoint it was found with: deleting the checkpoint row (the fix a
// refused checkpoint prints), or another instance with its own checkpoint
// file on the same slot, still keeps the rows until verify --repair.
func TestRetentionHoldSurvivesCheckpointForget(t *testing.T) {
	t.Run("checkpoint row deleted", func(t *testing.T) {
		holdSurvivesForget(t, "retforget", nil, nil, func(t *testing.T, dsn string) {
			exec1(t, dsn, "DELETE FROM outbox_cdc.checkpoints WHERE slot = $1", "retforget")
		})
	})
	t.Run("another instance's checkpoint file", func(t *testing.T) {
		fileEnv := func(name string) []string {
			return []string{"OUTBOX_CDC_CHECKPOINT_STORE=file", "OUTBOX_CDC_CHECKPOINT_FILE=" + filepath.Join(t.TempDir(), name)}
		}
		holdSurvivesForget(t, "retforgetf", fileEnv("a"), fileEnv("b"), func(*testing.T, string) {})
	})
}

// holdSurvivesForget runs TestRetentionHoldSurvivesCheckpointForget: the
// instance with envA finds the lost slot; forget runs while it is stopped;
// the instance with envB runs next and must keep the held rows.
func holdSurvivesForget(t *testing.T, slot string, envA, envB []string, forget func(t *testing.T, dsn string)) {
	const retain = 2 * time.Second
	dsn, conn, aggType, cfgPath := retentionSetup(t, slot, retain)
	topics := []string{topicFor(aggType)}
	p := startRetentionEnv(t, cfgPath, envA...)
	delivered := deliverAndStop(t, conn, p, aggType)

	dropStoppedSlot(t, dsn, slot)
	lost := insertRows(t, conn, "outbox", aggType, 10)
	p = startRetentionEnv(t, cfgPath, envA...) // creates the slot again, holds the lost rows
	later := insertRows(t, conn, "outbox", aggType, 5)
	consumeN(t, topics, len(delivered)+len(later), time.Minute, 0)
	time.Sleep(3 * retain)
	if n := countIDs(t, conn, lost); n != len(lost) {
		t.Fatalf("%d of the %d rows the lost slot never delivered deleted by the instance that found it", len(lost)-n, len(lost))
	}
	stopClean(t, p)

	forget(t, dsn)
	p = startRetentionEnv(t, cfgPath, envB...)
	after := insertRows(t, conn, "outbox", aggType, 5)
	consumeN(t, topics, len(delivered)+len(later)+len(after), time.Minute, 0)
	time.Sleep(3 * retain) // rounds past the new rows
	if n := countIDs(t, conn, lost); n != len(lost) {
		t.Errorf("%d of the %d rows the lost slot never delivered deleted once the checkpoint was forgotten", len(lost)-n, len(lost))
	}

	verifyClears(t, cfgPath, envB, time.Now().Add(-time.Hour))
	waitFor(t, time.Minute, "every row deleted once the hold is lifted", func() bool {
		return queryInt(t, conn, "SELECT count(*) FROM outbox") == 0
	})
	stopClean(t, p)
	ids := concat(delivered, lost, later, after)
	checkDeletedAfterAck(t, conn, readIDs(t, topics, ids, 30*time.Second), ids)
}

// TestRetentionSecondSlot: another logical slot of the database (another
// connector, Debezium beside it) that does not advance holds back
// retention: rows committed after it was created stay while it lags, and go
// once it is advanced past them, or dropped.
func TestRetentionSecondSlot(t *testing.T) {
	const slot, retain = "retslot2", 2 * time.Second
	dsn, conn, aggType, cfgPath := retentionSetup(t, slot, retain)
	topics := []string{topicFor(aggType)}
	other := "retother_" + runID
	dropSlotAtEnd(t, dsn, other)
	p := startRetention(t, cfgPath)
	first := insertRows(t, conn, "outbox", aggType, 5)
	waitFor(t, time.Minute, "rows deleted with this slot alone", func() bool {
		return queryInt(t, conn, "SELECT count(*) FROM deleted_rows") == len(first)
	})

	exec1(t, dsn, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", other)
	held := insertRows(t, conn, "outbox", aggType, 10)
	consumeN(t, topics, len(first)+len(held), time.Minute, 0)
	time.Sleep(3 * retain)
	if n := countIDs(t, conn, held); n != len(held) {
		t.Errorf("%d of the %d rows committed after slot %s was created deleted while it lags", len(held)-n, len(held), other)
	}
	exec1(t, dsn, "SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())", other)
	waitFor(t, time.Minute, "the rows deleted once the other slot advanced", func() bool { return countIDs(t, conn, held) == 0 })

	more := insertRows(t, conn, "outbox", aggType, 5)
	consumeN(t, topics, len(first)+len(held)+len(more), time.Minute, 0)
	time.Sleep(3 * retain)
	if n := countIDs(t, conn, more); n != len(more) {
		t.Errorf("%d of the %d rows committed after slot %s was advanced deleted while it lags again", len(more)-n, len(more), other)
	}
	exec1(t, dsn, "SELECT pg_drop_replication_slot($1)", other)
	waitFor(t, time.Minute, "every row deleted once the other slot is dropped", func() bool {
		return queryInt(t, conn, "SELECT count(*) FROM outbox") == 0
	})
	stopClean(t, p)
	ids := concat(first, held, more)
	checkDeletedAfterAck(t, conn, readIDs(t, topics, ids, 30*time.Second), ids)
}

// retentionSetup makes a database with a retention outbox, the topic of
// aggregate type slot+runID, and the binary's configuration.
func retentionSetup(t *testing.T, slot string, retain time.Duration) (dsn string, conn *pgx.Conn, aggType, cfgPath string) {
	t.Helper()
	dsn = newDatabase(t)
	retentionTable(t, dsn, "outbox")
	aggType = slot + runID
	appendTimeTopic(t, topicFor(aggType))
	cfgPath = retentionYAML(t, dsn, slot, "retention: "+retain.String(), "")
	return dsn, pgConnect(t, dsn), aggType, cfgPath
}

// deliverAndStop commits 10 rows, waits until retention deleted them (so
// the checkpoint is past them), and stops the connector.
func deliverAndStop(t *testing.T, conn *pgx.Conn, p *process, aggType string) []string {
	t.Helper()
	ids := insertRows(t, conn, "outbox", aggType, 10)
	waitFor(t, time.Minute, "the delivered rows deleted", func() bool {
		return queryInt(t, conn, "SELECT count(*) FROM deleted_rows") == len(ids)
	})
	stopClean(t, p)
	return ids
}

// dropStoppedSlot drops the slot of a stopped connector, once its
// walsender has let it go.
func dropStoppedSlot(t *testing.T, dsn, slot string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cdctest.DropSlot(ctx, pgConnect(t, dsn), slot); err != nil {
		t.Fatal(err)
	}
}

// startRetentionEnv is startRetention with extra environment entries.
func startRetentionEnv(t *testing.T, cfgPath string, env ...string) *process {
	t.Helper()
	addr := freeAddr(t)
	return startProc(t, cfgPath, addr, true, append([]string{"OUTBOX_CDC_HTTP_LISTEN=" + addr}, env...)...)
}

// verifyClears runs verify --repair from since and expects it to clear the
// lost slot's hold.
func verifyClears(t *testing.T, cfgPath string, env []string, since time.Time) {
	t.Helper()
	code, out := runBinary(t, 2*time.Minute, env, "verify", "--repair", "--config", cfgPath,
		"--since", since.UTC().Format(time.RFC3339))
	if code != 0 || !strings.Contains(out, "the lost slot's hold is cleared") {
		t.Fatalf("verify --repair --since %s: exit %d, want 0 clearing the hold:\n%s", since.UTC().Format(time.RFC3339), code, out)
	}
}

// insertBackdated commits n rows of aggType, one transaction each, whose
// created_at the application sets to ago (an interval) before now.
func insertBackdated(t *testing.T, conn *pgx.Conn, aggType string, n int, ago string) []string {
	t.Helper()
	var ids []string
	for range n {
		var id string
		if err := conn.QueryRow(context.Background(), `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at)
			VALUES ($1, 'b', 'E', '{}', now() - $2::interval) RETURNING id::text`, aggType, ago).Scan(&id); err != nil {
			t.Fatalf("insert: %v", err)
		}
		ids = append(ids, id)
	}
	return ids
}

// countIDs counts the rows of ids still in the outbox.
func countIDs(t *testing.T, conn *pgx.Conn, ids []string) int {
	t.Helper()
	return queryInt(t, conn, "SELECT count(*) FROM outbox WHERE id = ANY($1::uuid[])", ids)
}

func concat(lists ...[]string) []string {
	var all []string
	for _, l := range lists {
		all = append(all, l...)
	}
	return all
}

// readIDs reads topics from the beginning until a record of every id
// arrived or timeout passed; it does not fail on missing ones (the caller
// names them: checkDeletedAfterAck).
func readIDs(t *testing.T, topics, ids []string, timeout time.Duration) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafkaServer.Brokers()...), kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatalf("consumer: %v", err)
	}
	defer cl.Close()
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var recs []*kgo.Record
	for len(want) > 0 && ctx.Err() == nil {
		fs := cl.PollFetches(ctx)
		fs.EachError(func(topic string, p int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				t.Logf("fetch %s/%d: %v", topic, p, err)
			}
		})
		fs.EachRecord(func(r *kgo.Record) {
			recs = append(recs, r)
			if id, ok := header(r, "id"); ok {
				delete(want, id)
			}
		})
	}
	return recs
}
