package config

import (
	"cmp"
	"reflect"
	"slices"
	"testing"
)

func TestTablesInherit(t *testing.T) {
	t.Parallel()
	p := writeFile(t, withRequiredYAML(t, `
outbox:
  columns: {payload: body}
  header_columns: [tenant]
  tombstone_on_empty_payload: true
  tables:
    - table: public.orders_outbox
    - table: billing.outbox
      columns: {aggregate_id: invoice_id}
      header_columns: []
      tombstone_on_empty_payload: false
      topic: billing.{aggregate_type}
      topics: {invoice: billing.invoices}
      format: cloudevents-structured
      cloudevents: {content_type: application/json}
kafka:
  topic: shop.{aggregate_type}
`))
	cfg, err := Load(p, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Outbox.Table != "" {
		t.Errorf("outbox.table = %q with outbox.tables set; want it empty", cfg.Outbox.Table)
	}
	per := cfg.PerTable()
	if len(per) != 2 {
		t.Fatalf("%d tables, want 2", len(per))
	}
	a, b := per[0], per[1]
	for _, c := range []struct {
		name      string
		got, want any
	}{
		{"[0].table", a.Outbox.Table, "public.orders_outbox"},
		{"[0].columns", a.Outbox.Columns, Columns{"id", "aggregate_type", "aggregate_id", "event_type", "body"}},
		{"[0].header_columns", a.Outbox.HeaderColumns, []string{"tenant"}},
		{"[0].tombstone", a.Outbox.TombstoneOnEmptyPayload, true},
		{"[0].topic", a.Kafka.Topic, "shop.{aggregate_type}"},
		{"[0].format", a.Kafka.Format, "plain"},
		{"[1].table", b.Outbox.Table, "billing.outbox"},
		{"[1].columns", b.Outbox.Columns, Columns{"id", "aggregate_type", "invoice_id", "event_type", "body"}},
		{"[1].header_columns", b.Outbox.HeaderColumns, []string{}},
		{"[1].tombstone", b.Outbox.TombstoneOnEmptyPayload, false},
		{"[1].topic", b.Kafka.Topic, "billing.{aggregate_type}"},
		{"[1].topics", b.Kafka.Topics, map[string]string{"invoice": "billing.invoices"}},
		{"[1].format", b.Kafka.Format, "cloudevents-structured"},
		{"[1].cloudevents", b.Kafka.CloudEvents, KafkaCloudEvents{Source: "/outbox-cdc/{database}/{schema}.{table}", ContentType: "application/json"}},
		{"[1].tables", b.Outbox.Tables, []OutboxTable(nil)},
		{"[1].dlq_topic", b.Kafka.DLQTopic, "outbox.dlq"},
	} {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s = %#v, want %#v", c.name, c.got, c.want)
		}
	}
	if s, n := b.Outbox.SchemaTable(); s != "billing" || n != "outbox" {
		t.Errorf("[1] SchemaTable = %s, %s", s, n)
	}
	// One table: PerTable is the configuration itself.
	one := withRequired()
	if per := one.PerTable(); len(per) != 1 || !reflect.DeepEqual(per[0], one) {
		t.Errorf("PerTable of a single-table config = %#v", per)
	}
}

func TestTablesErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, yaml string
		env        []string
		key        string
		want       []string
	}{
		{"both set", "outbox: {table: public.outbox, tables: [{table: a}]}", nil,
			"outbox.table", []string{"set together with outbox.tables", "remove outbox.table"}},
		{"env table with file tables", "outbox: {tables: [{table: a}]}", []string{"OUTBOX_CDC_OUTBOX_TABLE=b"},
			"outbox.table", []string{"set together with outbox.tables", "OUTBOX_CDC_OUTBOX_TABLE"}},
		{"tables from env", "", []string{"OUTBOX_CDC_OUTBOX_TABLES=a,b"},
			"outbox.tables", []string{"config file only"}},
		{"duplicate", "outbox: {tables: [{table: orders}, {table: public.orders}]}", nil,
			"outbox.tables[1].table", []string{"the same table as outbox.tables[0]"}},
		{"missing table", "outbox: {tables: [{table: a}, {topic: x}]}", nil,
			"outbox.tables[1].table", []string{"required"}},
		{"bad table", "outbox: {tables: [{table: a.b.c}]}", nil,
			"outbox.tables[0].table", []string{"too many dots"}},
		{"bad column", "outbox: {tables: [{table: a, columns: {id: 1x}}]}", nil,
			"outbox.tables[0].columns.id", []string{"not a plain identifier"}},
		{"bad header", "outbox: {tables: [{table: a, header_columns: [id]}]}", nil,
			"outbox.tables[0].header_columns[0]", []string{"always sent"}},
		{"bad format", "outbox: {tables: [{table: a, format: avro}]}", nil,
			"outbox.tables[0].format", nil},
		{"bad topic", "outbox: {tables: [{table: a, topic: 'bad topic'}]}", nil,
			"outbox.tables[0].topic", nil},
		{"unknown key", "outbox: {tables: [{table: a, tpoic: x}]}", nil,
			"outbox.tables[0].tpoic", []string{"unknown key", "topic"}},
		{"not a list", "outbox: {tables: a}", nil,
			"outbox.tables", []string{"expected a list"}},
		{"wrong type", "outbox: {tables: [{table: a, header_columns: x}]}", nil,
			"outbox.tables[0].header_columns", []string{"expected a list"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Load(writeFile(t, withRequiredYAML(t, cmp.Or(tt.yaml, "{}"))), tt.env)
			hasKey(t, err, tt.key, tt.want...)
		})
	}
}

// An inherited top-level problem is reported once, under its own key.
func TestTablesInheritedProblemOnce(t *testing.T) {
	t.Parallel()
	_, err := Load(writeFile(t, withRequiredYAML(t, "outbox: {columns: {id: 1x}, tables: [{table: a}, {table: b}]}")), nil)
	var keys []string
	for _, f := range fieldErrors(t, err) {
		keys = append(keys, f.Key)
	}
	if !slices.Equal(keys, []string{"outbox.columns.id"}) {
		t.Errorf("keys %v, want only outbox.columns.id", keys)
	}
}
