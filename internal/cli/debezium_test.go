package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/decode"
	"github.com/outbox-cdc/outbox-cdc/internal/config"
	"github.com/outbox-cdc/outbox-cdc/router"
)

var testEnv = []string{"OUTBOX_CDC_POSTGRES_DSN=postgres://app@db/app", "OUTBOX_CDC_KAFKA_BROKERS=k:9092"}

// loadYAML loads a translation as the connector would.
func loadYAML(t *testing.T, yaml string) *config.Config {
	t.Helper()
	p := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(p, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(p, testEnv)
	if err != nil {
		t.Fatalf("load translation:\n%s\n%v", yaml, err)
	}
	return cfg
}

// The translation of each Debezium config the integration test runs routes
// rows exactly as the translation written by hand (and checked there
// against Debezium's records) does.
func TestFromDebeziumMatchesTestdata(t *testing.T) {
	dir := filepath.Join("..", "..", "test", "integration", "testdata", "eventrouter")
	for _, name := range []string{"documented", "placements"} {
		t.Run(name, func(t *testing.T) {
			var out, errs bytes.Buffer
			if code := Run(t.Context(), []string{"from-debezium", filepath.Join(dir, name+".properties")}, &out, &errs, nil); code != ExitOK {
				t.Fatalf("exit %d: %s", code, errs.String())
			}
			got := loadYAML(t, out.String())
			hand, err := os.ReadFile(filepath.Join(dir, name+".yaml"))
			if err != nil {
				t.Fatal(err)
			}
			want := loadYAML(t, string(hand))
			if got.Outbox.Table != want.Outbox.Table || got.Outbox.Columns != want.Outbox.Columns ||
				got.Postgres.Slot != want.Postgres.Slot || got.Postgres.Publication != want.Postgres.Publication {
				t.Errorf("translation\n%s\ndiffers from %s.yaml in table, columns, slot or publication", out.String(), name)
			}
			gr, err := router.New(got.Routes())
			if err != nil {
				t.Fatal(err)
			}
			wr, err := router.New(want.Routes())
			if err != nil {
				t.Fatal(err)
			}
			for _, ev := range sampleEvents() {
				var g, w router.Record
				src := router.Source{Commit: time.Unix(1e9, 0), Xid: 7, LSN: 0x100}
				gReason, wReason := gr.RouteFrom(&ev, src, &g), wr.RouteFrom(&ev, src, &w)
				if gReason != wReason || !reflect.DeepEqual(g, w) {
					t.Errorf("translated routes %+v (%q), hand-written %+v (%q)", g, gReason, w, wReason)
				}
			}
		})
	}
}

func sampleEvents() []decode.Event {
	v := func(s string) decode.Value { return decode.Value{Bytes: []byte(s)} }
	cols := []decode.Column{{Name: "type", Value: v("OrderCreated"), Type: 1043}, {Name: "p", Value: v("2"), Type: 23},
		{Name: "timestamp", Value: v("2019-05-03 13:58:14.344123"), Type: 1114}}
	ev := decode.Event{ID: v("406c07f3-26f0-4eea-a50c-109940064b8f"), AggregateType: v("Order"), AggregateID: v("1"),
		EventType: v("OrderCreated"), Payload: v(`{"id": 1}`), Columns: cols}
	tomb := ev
	tomb.Payload = decode.Value{Null: true}
	return []decode.Event{ev, tomb}
}

func TestFromDebezium(t *testing.T) {
	base := "transforms=a, outbox\ntransforms.outbox.type=io.debezium.transforms.outbox.EventRouter\n" +
		"table.include.list=public.outbox\n"
	tests := []struct {
		name       string
		props      string
		wantYAML   []string // substrings
		wantNotes  []string
		wantErr    string
		wantRoutes func(router.Config) bool
	}{
		{name: "defaults", props: base + "database.hostname=db\ndatabase.port=5433\ndatabase.user=app\ndatabase.dbname=orders\ndatabase.password=x\n",
			wantYAML:  []string{`dsn: "postgres://app@db:5433/orders"`, `topic: "outbox.event.{aggregate_type}"`, "standard_headers: [id]"},
			wantNotes: []string{"database.password is not copied"}},
		{name: "custom regex", props: base + "transforms.outbox.route.topic.regex=(?<t>[a-z]+)\\\n  s?\ntransforms.outbox.route.topic.replacement=events.${t}\n",
			wantYAML:  []string{`topic_regex: "(?<t>[a-z]+)s?"`, `topic_replacement: "events.${t}"`},
			wantNotes: []string{"__debezium.context.* headers are not sent"}},
		{name: "unsupported options", props: base + "transforms.outbox.table.expand.json.payload=true\n" +
			"transforms.outbox.table.field.event.schema.version=v\ntransforms.outbox.table.field.additional.missing=ignore\n" +
			"value.converter=org.apache.kafka.connect.json.JsonConverter\nvalue.converter.schemas.enable=false\n",
			wantNotes: []string{"table.expand.json.payload=true", "table.field.event.schema.version=v",
				"additional.missing=ignore", "quotes the payload"}},
		{name: "no event router", props: "transforms=x\ntransforms.x.type=Other\ntable.include.list=t\n", wantErr: "no transform"},
		{name: "two tables", props: base + "table.include.list=public.a, billing.b\n",
			wantYAML:  []string{"  tables:\n    - table: \"public.a\"\n    - table: \"billing.b\"\n", "    aggregate_id: \"aggregateid\""},
			wantNotes: []string{"__debezium.context.* headers are not sent"}},
		// Debezium's context headers off: nothing differs, nothing to say.
		{name: "context headers off", props: base + "extended.headers.enabled=false\n",
			wantYAML: []string{`topic: "outbox.event.{aggregate_type}"`}},
		{name: "no table", props: base + "table.include.list= ,\n", wantErr: "table.include.list"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := readProperties(strings.NewReader(tc.props))
			if err != nil {
				t.Fatal(err)
			}
			yaml, notes, err := fromDebezium(p)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.wantYAML {
				if !strings.Contains(yaml, w) {
					t.Errorf("YAML lacks %q:\n%s", w, yaml)
				}
			}
			all := strings.Join(notes, "\n")
			for _, w := range tc.wantNotes {
				if !strings.Contains(all, w) {
					t.Errorf("notes lack %q:\n%s", w, all)
				}
			}
			if len(tc.wantNotes) == 0 && len(notes) > 0 {
				t.Errorf("unexpected notes:\n%s", all)
			}
			loadYAML(t, yaml) // every translation is a valid configuration
		})
	}
}
