package outbox

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// fakeTx records Exec calls; every other pgx.Tx method panics (nil embed).
type fakeTx struct {
	pgx.Tx
	sql  []string
	args [][]any
}

func (f *fakeTx) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	f.sql = append(f.sql, sql)
	f.args = append(f.args, args)
	return pgconn.NewCommandTag("INSERT 0 1"), nil
}

func TestTableDDLMatchesSQLFile(t *testing.T) {
	b, err := os.ReadFile("../sql/outbox.sql")
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for l := range strings.SplitSeq(string(b), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "--") {
			lines = append(lines, l)
		}
	}
	if got, want := norm(strings.Join(lines, "\n")), norm(TableDDL); got != want {
		t.Fatalf("sql/outbox.sql and TableDDL differ:\n%s\n---\n%s", got, want)
	}
}

func norm(s string) string { return strings.Join(strings.Fields(s), " ") }

func TestWriteSQLAndArgs(t *testing.T) {
	ctx := context.Background()
	tx := &fakeTx{}
	err := Write(ctx, tx, Event{AggregateType: "order", AggregateID: "o-1", EventType: "OrderPlaced",
		Payload: map[string]int{"qty": 2}, Headers: map[string]any{"tenant": "acme", "trace": nil, "region": "eu"}})
	if err != nil {
		t.Fatal(err)
	}
	want := `INSERT INTO "public"."outbox" ("id", "aggregate_type", "aggregate_id", "event_type", "payload", "region", "tenant") VALUES ($1, $2, $3, $4, $5, $6, $7)`
	if tx.sql[0] != want {
		t.Fatalf("sql\n got %s\nwant %s", tx.sql[0], want)
	}
	a := tx.args[0]
	id, err := uuid.Parse(a[0].(string))
	if err != nil || id.Version() != 7 {
		t.Fatalf("generated id %v: %v (version %d), want a UUID v7", a[0], err, id.Version())
	}
	if string(a[4].([]byte)) != `{"qty":2}` || a[5] != "eu" || a[6] != "acme" || len(a) != 7 {
		t.Fatalf("args %v", a)
	}

	// Debezium-style names, own table, explicit id, raw bytes and tombstone.
	w, err := New(Config{Table: "Shop.Outbox", Columns: DebeziumColumns, NewID: NewV4})
	if err != nil {
		t.Fatal(err)
	}
	tx = &fakeTx{}
	if err := w.Write(ctx, tx, Event{ID: "e-1", AggregateType: "a", AggregateID: "b", EventType: "c", Payload: []byte{0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := w.Write(ctx, tx, Event{AggregateType: "a", AggregateID: "b", EventType: "c"}); err != nil {
		t.Fatal(err)
	}
	want = `INSERT INTO "Shop"."Outbox" ("id", "aggregatetype", "aggregateid", "type", "payload") VALUES ($1, $2, $3, $4, $5)`
	if tx.sql[0] != want {
		t.Fatalf("sql\n got %s\nwant %s", tx.sql[0], want)
	}
	if tx.args[0][0] != "e-1" || !reflect.DeepEqual(tx.args[0][4], []byte{0, 1}) {
		t.Fatalf("args %v", tx.args[0])
	}
	if id, err := uuid.Parse(tx.args[1][0].(string)); err != nil || id.Version() != 4 {
		t.Fatalf("NewV4 id %v", tx.args[1][0])
	}
	if tx.args[1][4].([]byte) != nil {
		t.Fatalf("nil payload must be NULL, got %v", tx.args[1][4])
	}
}

func TestInvalid(t *testing.T) {
	ctx := context.Background()
	ok := Event{AggregateType: "a", AggregateID: "b", EventType: "c"}
	bad := []Event{
		{AggregateID: "b", EventType: "c"},
		{AggregateType: "a", EventType: "c"},
		{AggregateType: "a", AggregateID: "b"},
		func() Event { e := ok; e.Payload = json.RawMessage(`{"x":`); return e }(),
		func() Event { e := ok; e.Payload = func() {}; return e }(),
		func() Event { e := ok; e.Headers = map[string]any{"payload": "x"}; return e }(),
	}
	for i, e := range bad {
		if err := Write(ctx, &fakeTx{}, e); !errors.Is(err, ErrInvalidEvent) {
			t.Errorf("Write bad[%d]: err = %v, want ErrInvalidEvent", i, err)
		}
	}
	for _, h := range []string{"id", "event_type", "aggregate_type", ""} {
		e := ok
		e.Headers = map[string]any{h: "x"}
		if err := Emit(ctx, &fakeTx{}, e); !errors.Is(err, ErrInvalidEvent) {
			t.Errorf("Emit header %q: err = %v, want ErrInvalidEvent", h, err)
		}
	}
	for _, cfg := range []Config{{Table: "a.b.c"}, {Table: ".x"}, {Columns: Columns{EventType: "aggregate_type"}}} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) accepted", cfg)
		}
	}
}

func TestEmitFormat(t *testing.T) {
	ctx := context.Background()
	at := time.Date(2025, 3, 4, 5, 6, 7, 8, time.UTC)
	cases := []struct {
		payload any
		want    map[string]any // members besides the fixed ones
	}{
		{json.RawMessage(`{ "qty" : 2 }`), map[string]any{"payload": map[string]any{"qty": 2.0}}},
		{map[string]any{"s": "x"}, map[string]any{"payload": map[string]any{"s": "x"}}},
		{"text", map[string]any{"payload": "text"}},
		{[]byte{0xff, 0, 'a'}, map[string]any{"payload_base64": base64.StdEncoding.EncodeToString([]byte{0xff, 0, 'a'})}},
		{[]byte{}, map[string]any{"payload_base64": ""}},
		{nil, map[string]any{}},
		{[]byte(nil), map[string]any{}},
		{json.RawMessage(nil), map[string]any{}},
	}
	for i, c := range cases {
		tx := &fakeTx{}
		e := Event{ID: "id-1", AggregateType: "order", AggregateID: "o-1", EventType: "OrderPlaced", Payload: c.payload,
			Headers: map[string]any{"tenant": "acme", "n": 7, "at": at, "skip": nil}}
		if err := Emit(ctx, tx, e); err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		if tx.sql[0] != `SELECT pg_logical_emit_message(true, $1::text, $2::bytea)` || tx.args[0][0] != "outbox" {
			t.Fatalf("case %d: %s %v", i, tx.sql[0], tx.args[0][0])
		}
		var got map[string]any
		if err := json.Unmarshal(tx.args[0][1].([]byte), &got); err != nil {
			t.Fatalf("case %d: content %q: %v", i, tx.args[0][1], err)
		}
		want := map[string]any{"id": "id-1", "aggregate_type": "order", "aggregate_id": "o-1", "event_type": "OrderPlaced",
			"headers": map[string]any{"tenant": "acme", "n": "7", "at": "2025-03-04T05:06:07.000000008Z"}}
		for k, v := range c.want {
			want[k] = v
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("case %d: content\n got %v\nwant %v", i, got, want)
		}
	}

	// Custom prefix, generated id, no headers member when there are none.
	w, err := New(Config{Prefix: "shop"})
	if err != nil {
		t.Fatal(err)
	}
	tx := &fakeTx{}
	if err := w.Emit(ctx, tx, Event{AggregateType: "a", AggregateID: "b", EventType: "c", Payload: 1}); err != nil {
		t.Fatal(err)
	}
	if tx.args[0][0] != "shop" {
		t.Fatalf("prefix %v", tx.args[0][0])
	}
	re := regexp.MustCompile(`^\{"id":"[0-9a-f-]{36}","aggregate_type":"a","aggregate_id":"b","event_type":"c","payload":1\}$`)
	if s := string(tx.args[0][1].([]byte)); !re.MatchString(s) {
		t.Fatalf("content %s", s)
	}
}

// TestNullPayloadOneMeaning: a payload that is or encodes to JSON null (a
// typed nil pointer, map or slice, json.RawMessage("null")) was a JSON null
// value through Write and a tombstone, which deletes the key on a compacted
// topic, through Emit. Both now refuse it: a tombstone is an untyped nil.
func TestNullPayloadOneMeaning(t *testing.T) {
	type order struct{ ID string }
	ctx := context.Background()
	for _, p := range []any{(*order)(nil), map[string]int(nil), []string(nil), json.RawMessage(`null`), json.RawMessage(` null `)} {
		e := Event{AggregateType: "a", AggregateID: "b", EventType: "c", Payload: p}
		tx := &fakeTx{}
		werr, eerr := Write(ctx, tx, e), Emit(ctx, tx, e)
		if !errors.Is(werr, ErrInvalidEvent) || !errors.Is(eerr, ErrInvalidEvent) {
			t.Errorf("payload %#v: Write = %v, Emit = %v; want ErrInvalidEvent from both", p, werr, eerr)
		}
		if len(tx.args) != 0 {
			t.Errorf("payload %#v: %d statements run", p, len(tx.args))
		}
	}
}

// TestVersion: Event.Version goes to the aggregate_version column (Write) or
// header (Emit), without touching the caller's headers.
func TestVersion(t *testing.T) {
	ctx := context.Background()
	headers := map[string]any{"tenant": "acme"}
	e := Event{ID: "e-1", AggregateType: "a", AggregateID: "b", EventType: "c", Payload: 1, Headers: headers, Version: 7}
	tx := &fakeTx{}
	if err := Write(ctx, tx, e); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(tx.sql[0], `"aggregate_version", "tenant"`) || tx.args[0][5] != int64(7) {
		t.Fatalf("Write: %s %v", tx.sql[0], tx.args[0])
	}
	if len(headers) != 1 {
		t.Fatalf("the caller's headers were modified: %v", headers)
	}
	b, err := defaultWriter.EncodeMessage(e)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"aggregate_version":"7"`) {
		t.Fatalf("EncodeMessage: %s", b)
	}
	e.Headers = map[string]any{"aggregate_version": 3}
	if err := Write(ctx, tx, e); !errors.Is(err, ErrInvalidEvent) {
		t.Fatalf("Version and the header both set: %v", err)
	}
}
