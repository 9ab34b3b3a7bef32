package config

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
)

// OutboxTable is one entry of outbox.tables: an outbox table and what it
// routes differently from the top-level keys, which are its defaults. An
// empty string, a missing list or mapping and a missing boolean inherit the
// top-level value; each of outbox.columns' keys is inherited on its own.
type OutboxTable struct {
	Table                   string            `koanf:"table"`
	Columns                 Columns           `koanf:"columns"`
	HeaderColumns           []string          `koanf:"header_columns"`
	TraceColumn             string            `koanf:"trace_column"`
	Fields                  []string          `koanf:"fields"`
	StandardHeaders         []string          `koanf:"standard_headers"`
	SourceHeaders           []string          `koanf:"source_headers"`
	TombstoneOnEmptyPayload *bool             `koanf:"tombstone_on_empty_payload"`
	TimestampColumn         string            `koanf:"timestamp_column"`
	Topic                   string            `koanf:"topic"`
	Topics                  map[string]string `koanf:"topics"`
	TopicRegex              string            `koanf:"topic_regex"`
	TopicReplacement        string            `koanf:"topic_replacement"`
	Format                  string            `koanf:"format"`
	CloudEvents             KafkaCloudEvents  `koanf:"cloudevents"`
}

// kindTables is outbox.tables: a list of mappings, from the file only.
var kindTables = &kind{"a list of tables", "write a list of mappings such as [{table: public.orders_outbox}, {table: billing.outbox, topic: billing.{aggregate_type}}] in the config file (it cannot be set from the environment)"}

// PerTable returns the configuration as each outbox table sees it: a copy
// of c per table with outbox.table and the table's overrides in place of
// the top-level keys, and outbox.tables empty. With outbox.tables unset it
// is c alone. Call it on a validated Config.
func (c *Config) PerTable() []Config {
	if len(c.Outbox.Tables) == 0 {
		return []Config{*c}
	}
	out := make([]Config, len(c.Outbox.Tables))
	for i, t := range c.Outbox.Tables {
		tc := *c
		ob, k := &tc.Outbox, &tc.Kafka
		ob.Tables, ob.Table = nil, t.Table
		ob.Columns = Columns{
			ID: or(t.Columns.ID, ob.Columns.ID), AggregateType: or(t.Columns.AggregateType, ob.Columns.AggregateType),
			AggregateID: or(t.Columns.AggregateID, ob.Columns.AggregateID), EventType: or(t.Columns.EventType, ob.Columns.EventType),
			Payload: or(t.Columns.Payload, ob.Columns.Payload),
		}
		ob.HeaderColumns = orList(t.HeaderColumns, ob.HeaderColumns)
		ob.TraceColumn = or(t.TraceColumn, ob.TraceColumn)
		ob.Fields = orList(t.Fields, ob.Fields)
		ob.StandardHeaders = orList(t.StandardHeaders, ob.StandardHeaders)
		ob.SourceHeaders = orList(t.SourceHeaders, ob.SourceHeaders)
		if t.TombstoneOnEmptyPayload != nil {
			ob.TombstoneOnEmptyPayload = *t.TombstoneOnEmptyPayload
		}
		ob.TimestampColumn = or(t.TimestampColumn, ob.TimestampColumn)
		k.Topic = or(t.Topic, k.Topic)
		if t.Topics != nil {
			k.Topics = t.Topics
		}
		k.TopicRegex, k.TopicReplacement = or(t.TopicRegex, k.TopicRegex), or(t.TopicReplacement, k.TopicReplacement)
		k.Format = or(t.Format, k.Format)
		k.CloudEvents = KafkaCloudEvents{Source: or(t.CloudEvents.Source, k.CloudEvents.Source),
			ContentType: or(t.CloudEvents.ContentType, k.CloudEvents.ContentType)}
		out[i] = tc
	}
	return out
}

func or(s, dflt string) string {
	if s != "" {
		return s
	}
	return dflt
}

func orList(l, dflt []string) []string {
	if l != nil {
		return l
	}
	return dflt
}

// tables checks outbox.tables: every entry as its own outbox section, under
// its own keys (outbox.tables[1].topic), without repeating a problem of an
// inherited top-level value.
func (v *validator) tables(c *Config) {
	ts := c.Outbox.Tables
	if len(ts) == 0 {
		return
	}
	if c.Outbox.Table != "" {
		v.add("outbox.table", c.Outbox.Table, "set together with outbox.tables",
			"list every table under outbox.tables and remove outbox.table (and "+envName("outbox.table")+")")
	}
	top := map[FieldError]bool{}
	for _, p := range v.errs {
		top[p] = true
	}
	seen := map[string]int{}
	for i, tc := range c.PerTable() {
		prefix := fmt.Sprintf("outbox.tables[%d]", i)
		if tc.Outbox.Table == "" {
			v.add(prefix+".table", "", "required", "name the outbox table as schema.table or table (schema public)")
			continue
		}
		var sub validator
		sub.outbox(tc.Outbox)
		sub.tracing(tc.Outbox, tc.OTel)
		sub.routes(tc.Kafka)
		sub.eventRouter(&tc)
		for _, p := range sub.errs {
			if top[p] {
				continue // an inherited value, reported under its own key
			}
			p.Key = tableKey(prefix, p.Key)
			v.errs = append(v.errs, p)
		}
		s, t := tc.Outbox.SchemaTable()
		if j, dup := seen[s+"."+t]; dup {
			v.add(prefix+".table", tc.Outbox.Table, fmt.Sprintf("the same table as outbox.tables[%d]", j),
				"list each table once, with all its settings in one entry")
		}
		seen[s+"."+t] = i
	}
}

// tableKey names a key of the per-table copy as outbox.tables[i] spells it:
// outbox.columns.id → outbox.tables[i].columns.id, kafka.topic →
// outbox.tables[i].topic. Keys that are not per table stay as they are.
func tableKey(prefix, key string) string {
	for _, section := range []string{"outbox.", "kafka."} {
		rest, ok := strings.CutPrefix(key, section)
		if !ok {
			continue
		}
		name, _, _ := strings.Cut(rest, "[")
		name, _, _ = strings.Cut(name, ".")
		if slices.Contains(tableKeys(), name) {
			return prefix + "." + rest
		}
	}
	return key
}

// tableKeys are the keys of an outbox.tables entry.
func tableKeys() []string { return koanfNames(reflect.TypeFor[OutboxTable]()) }

// koanfNames are the keys of struct t's fields, in field order.
func koanfNames(t reflect.Type) []string {
	out := make([]string, t.NumField())
	for i := range out {
		out[i] = t.Field(i).Tag.Get("koanf")
	}
	return out
}

// convertTables reads outbox.tables from the file: a list of mappings whose
// keys are OutboxTable's, each converted like the top-level key of the same
// type.
func convertTables(l *leaf, v any, env string) (reflect.Value, *FieldError) {
	if env != "" {
		return reflect.Value{}, &FieldError{Key: l.key, Problem: env + " is not supported: outbox.tables is set in the config file only",
			Fix: "unset " + env + "; for one table " + envName("outbox.table") + " sets outbox.table"}
	}
	list, ok := v.([]any)
	if !ok {
		got, _, _ := yamlValue(v)
		return reflect.Value{}, &FieldError{Key: l.key, Value: fmt.Sprint(v), Problem: "expected a list, got " + got, Fix: l.kind.howTo}
	}
	out := make([]OutboxTable, len(list))
	for i, item := range list {
		prefix := fmt.Sprintf("%s[%d]", l.key, i)
		m, ok := item.(map[string]any)
		if !ok {
			got, _, _ := yamlValue(item)
			return reflect.Value{}, &FieldError{Key: prefix, Value: fmt.Sprint(item), Problem: "expected a mapping, got " + got,
				Fix: "write each table as a mapping such as {table: public.orders_outbox}"}
		}
		if fe := setTable(reflect.ValueOf(&out[i]).Elem(), prefix, m); fe != nil {
			return reflect.Value{}, fe
		}
	}
	return reflect.ValueOf(out), nil
}

// setTable sets the fields of the struct dst from m, one of the entries of
// outbox.tables (or a section inside one).
func setTable(dst reflect.Value, prefix string, m map[string]any) *FieldError {
	t := dst.Type()
	for _, name := range slices.Sorted(maps.Keys(m)) {
		key := prefix + "." + name
		known := koanfNames(t)
		i := slices.Index(known, name)
		if i < 0 {
			return &FieldError{Key: key, Problem: "unknown key", Fix: "keys of " + prefix + " are: " + strings.Join(slices.Sorted(slices.Values(known)), ", ")}
		}
		f, val := dst.Field(i), m[name]
		if val == nil {
			continue // null inherits
		}
		if f.Kind() == reflect.Struct {
			sub, ok := val.(map[string]any)
			if !ok {
				got, _, _ := yamlValue(val)
				return &FieldError{Key: key, Problem: "expected a section (mapping of keys), got " + got}
			}
			if fe := setTable(f, key, sub); fe != nil {
				return fe
			}
			continue
		}
		typ := f.Type()
		if typ.Kind() == reflect.Pointer {
			typ = typ.Elem()
		}
		// The top-level key of the same type says how to convert and explain it.
		kinds := map[reflect.Type]*kind{reflect.TypeFor[bool](): kindBool, reflect.TypeFor[[]string](): kindStrings,
			reflect.TypeFor[map[string]string](): kindStringMap}
		lf := &leaf{key: key, typ: typ, kind: kinds[typ]}
		if lf.kind == nil {
			lf.kind = kindString
		}
		x, fe := convert(lf, val, "")
		if fe != nil {
			return fe
		}
		if f.Kind() == reflect.Pointer {
			p := reflect.New(typ)
			p.Elem().Set(x)
			x = p
		}
		f.Set(x)
	}
	return nil
}
