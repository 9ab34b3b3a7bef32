package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// stoppedEnv is what the stopped-change tests share: a database with an
// outbox, a config on slot (kafkaExtra added to the kafka map), the rows of
// aggregate g on okType's topic, and an event whose topic (heldType's) does
// not exist until the test creates it, which holds the acknowledged position.
type stoppedEnv struct {
	ctx                                  context.Context
	dsn, slot, okType, heldType, cfgPath string
	conn                                 *pgx.Conn
	row                                  func(pgx.Tx, string)
	readCommitted                        bool
}

func newStoppedEnv(ctx context.Context, t *testing.T, slot, kafkaExtra string, readCommitted bool) *stoppedEnv {
	t.Helper()
	e := &stoppedEnv{ctx: ctx, dsn: newDatabase(t), slot: slot, readCommitted: readCommitted}
	createOutbox(t, e.dsn, "outbox", "jsonb")
	dropSlotAtEnd(t, e.dsn, slot)
	e.okType, e.heldType = slot+"ok"+runID, slot+"held"+runID
	createTopic(t, topicFor(e.okType), 1)
	e.cfgPath = writeConfig(t, fmt.Sprintf(`postgres: {dsn: %q, slot: %s, publication: %s, status_interval: 100ms, reconnect_backoff_max: 1s}
outbox: {table: public.outbox}
kafka: {brokers: [%s], dlq_topic: %s, topic: %q, auto_create_topics: false, unknown_topic_timeout: 10m%s}
http: {listen: ''}
`, e.dsn, slot, slot, strings.Join(kafkaServer.Brokers(), ", "), dlqFor(slot), topicTemplate, kafkaExtra))
	e.conn = pgConnect(t, e.dsn)
	e.row, _ = gapWriters(ctx, t, e.okType)
	return e
}

// values are g's rows on its topic, in order.
func (e *stoppedEnv) values(t *testing.T) []string {
	var out []string
	for _, r := range readIsolated(t, e.readCommitted, topicFor(e.okType)) {
		var v struct{ N string }
		if err := json.Unmarshal(r.Value, &v); err != nil {
			t.Fatalf("record %s: %v", r.Value, err)
		}
		out = append(out, v.N)
	}
	return out
}

func (e *stoppedEnv) seen(t *testing.T, n string) bool {
	return strings.Contains(","+strings.Join(e.values(t), ",")+",", ","+n+",")
}

// write commits row n of g.
func (e *stoppedEnv) write(t *testing.T, n string) {
	committed(t, e.conn, func(tx pgx.Tx) { e.row(tx, n) })
}

// hold commits the event whose topic does not exist yet.
func (e *stoppedEnv) hold(t *testing.T) {
	committed(t, e.conn, func(tx pgx.Tx) {
		if _, err := tx.Exec(e.ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
			VALUES ($1, 'h', 'E', '{}')`, e.heldType); err != nil {
			t.Fatalf("insert held: %v", err)
		}
	})
}

// savedStream is the checkpoint's position and stream state (none: 0, nil).
func (e *stoppedEnv) savedStream() (lsn.LSN, []struct {
	Xmin     uint64
	Verified lsn.LSN
}) {
	var pos, st string
	if err := e.conn.QueryRow(e.ctx, "SELECT lsn::text, coalesce(stream_state, '') FROM outbox_cdc.checkpoints WHERE slot = $1",
		e.slot).Scan(&pos, &st); err != nil {
		return 0, nil
	}
	l, _ := lsn.Parse(pos)
	var out []struct {
		Xmin     uint64
		Verified lsn.LSN
	}
	_ = json.Unmarshal([]byte(st), &out)
	return l, out
}

// flapWhileStopped takes the outbox out of the publication, writes row n,
// puts it back and creates the held event's topic.
func (e *stoppedEnv) flapWhileStopped(t *testing.T, n string) {
	exec1(t, e.dsn, "ALTER PUBLICATION "+e.slot+" DROP TABLE outbox")
	e.write(t, n)
	exec1(t, e.dsn, "ALTER PUBLICATION "+e.slot+" ADD TABLE outbox")
	createTopic(t, topicFor(e.heldType), 1)
}
