package integration

import (
	"strings"
	"testing"
	"time"
)

// TestRetentionLostSlot: rows committed after the last checkpoint whose
// slot was then lost were never delivered. The connector that creates the
// slot again keeps them from retention (the repair hold, saved in the
// checkpoint, so a restart keeps it too) while retention goes on with what
// the new slot delivers; verify --repair republishes them and lifts the
// hold, and retention then deletes them.
func TestRetentionLostSlot(t *testing.T) {
	dsn := newDatabase(t)
	retentionTable(t, dsn, "outbox")
	aggType := "retlost" + runID
	topics := []string{topicFor(aggType)}
	appendTimeTopic(t, topics[0])
	const slot, retain = "retlost", 2 * time.Second
	cfgPath := retentionYAML(t, dsn, slot, "retention: "+retain.String(), "")
	conn := pgConnect(t, dsn)
	p := startRetention(t, cfgPath)
	delivered := insertRows(t, conn, "outbox", aggType, 10)
	waitFor(t, time.Minute, "the delivered rows deleted", func() bool {
		return queryInt(t, conn, "SELECT count(*) FROM deleted_rows") == len(delivered)
	})
	stopClean(t, p)

	lost := insertRows(t, conn, "outbox", aggType, 10)
	dropReleasedSlot(t, dsn, slot)
	waitFor(t, time.Minute, "the undelivered rows past the retention", func() bool {
		return queryInt(t, conn, "SELECT count(*) FROM outbox WHERE created_at < now() - make_interval(secs => $1)", retain.Seconds()) == len(lost)
	})
	kept := func(when string) {
		t.Helper()
		if n := queryInt(t, conn, "SELECT count(*) FROM outbox WHERE id = ANY($1::uuid[])", lost); n != len(lost) {
			t.Fatalf("%s: %d of the %d rows the lost slot never delivered are left", when, n, len(lost))
		}
	}
	p = startRetention(t, cfgPath) // creates the slot again
	later := insertRows(t, conn, "outbox", aggType, 5)
	consumeN(t, topics, len(delivered)+len(later), time.Minute, 0)
	time.Sleep(3 * retain) // rounds on the new slot past the later rows: before the hold they deleted the lost ones
	kept("after rounds on the new slot")
	stopClean(t, p)
	p = startRetention(t, cfgPath)
	time.Sleep(3 * retain)
	kept("after a restart")

	code, out := runBinary(t, 2*time.Minute, nil, "verify", "--repair", "--config", cfgPath,
		"--since", time.Now().Add(-time.Hour).UTC().Format(time.RFC3339))
	if code != 0 || !strings.Contains(out, "the lost slot's hold is cleared") {
		t.Fatalf("verify --repair: exit %d, want 0 clearing the hold:\n%s", code, out)
	}
	waitFor(t, time.Minute, "every row deleted once the hold is lifted", func() bool {
		return queryInt(t, conn, "SELECT count(*) FROM outbox") == 0
	})
	stopClean(t, p)
	ids := append(append(append([]string(nil), delivered...), lost...), later...)
	recs := consumeN(t, topics, len(ids), time.Minute, 0)
	checkDeletedAfterAck(t, conn, recs, ids)
}
