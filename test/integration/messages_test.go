package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestIgnoredLogicalMessages: a table-less event emitted with a prefix other
// than outbox.message_prefix (a Writer left at another prefix) is not
// published; it used to vanish without a trace. It is counted by prefix, and
// the connector warns once for a prefix whose messages carry outbox events.
func TestIgnoredLogicalMessages(t *testing.T) {
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	if major := serverMajor(t, dsn); major < 14 {
		t.Skipf("PostgreSQL %d sends no logical decoding messages (TestTablelessOutbox checks the refusal)", major)
	}
	cfg := testConfig(t, dsn, "public.outbox", "ignoredmsg")
	cfg.Outbox.MessagePrefix = "outbox"
	c := startConnector(t, cfg)
	conn := pgConnect(t, dsn)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	event := `{"id": "%s", "aggregate_type": "ignoredmsg", "aggregate_id": "a1", "event_type": "E", "payload": {}}`
	for _, m := range []struct{ prefix, content string }{
		{"outbx", strings.Replace(event, "%s", "lost-1", 1)},
		{"outbx", strings.Replace(event, "%s", "lost-2", 1)},
		{"other-app", "not an event"},
		{"outbox", strings.Replace(event, "%s", "published", 1)},
	} {
		if _, err := conn.Exec(ctx, "SELECT pg_logical_emit_message(true, $1, $2)", m.prefix, m.content); err != nil {
			t.Fatal(err)
		}
	}
	// The published one comes after the others in the WAL: once it is on
	// the topic the pipeline has seen them all.
	if recs := consumeN(t, []string{topicFor("ignoredmsg")}, 1, time.Minute, time.Second); len(recs) != 1 {
		t.Fatalf("%d records, want the one event with the configured prefix", len(recs))
	}
	for prefix, want := range map[string]float64{"outbx": 2, "other-app": 1} {
		if got := testutil.ToFloat64(c.m.MessagesIgnored.WithLabelValues(prefix)); got != want {
			t.Errorf("outbox_cdc_logical_messages_ignored_total{prefix=%q} = %v, want %v", prefix, got, want)
		}
	}
	if !c.logged("carries an outbox event", "prefix=outbx") {
		t.Error("no warning for the outbox events emitted with prefix outbx")
	}
	if c.logged("carries an outbox event", "prefix=other-app") {
		t.Error("warned about other-app, whose messages are not outbox events")
	}
}
