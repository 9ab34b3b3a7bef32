package config

import (
	"reflect"
	"testing"

	"github.com/outbox-cdc/outbox-cdc/router"
)

// A Debezium-style configuration loads from YAML and the environment and
// becomes the router configuration it says.
func TestLoadEventRouter(t *testing.T) {
	t.Parallel()
	file := withRequiredYAML(t, `
outbox:
  fields: ["type:header:eventType", "type:envelope", "p:partition"]
  standard_headers: [id]
  timestamp_column: created_at
  tombstone_on_empty_payload: true
kafka:
  topic: "{aggregate_type}"
  topic_regex: "(?<routedByValue>.*)"
  topic_replacement: "outbox.event.${routedByValue}"
`)
	cfg, err := Load(writeFile(t, file), []string{"OUTBOX_CDC_OUTBOX_SOURCE_HEADERS=lsn,xid"})
	if err != nil {
		t.Fatal(err)
	}
	want := router.Config{
		TopicTemplate: "{aggregate_type}", Topics: map[string]string{}, DLQTopic: "outbox.dlq",
		TopicRegex: "(?<routedByValue>.*)", TopicReplacement: "outbox.event.${routedByValue}",
		Fields: []router.Field{{Column: "type", Placement: router.PlaceHeader, Alias: "eventType"},
			{Column: "type", Placement: router.PlaceEnvelope, Alias: "type"}, {Column: "p", Placement: router.PlacePartition, Alias: "p"}},
		StandardHeaders: []string{"id"}, SourceHeaders: []string{"lsn", "xid"},
		TimestampColumn: "created_at", TombstoneOnEmpty: true, Format: router.FormatPlain,
	}
	if got := cfg.Routes(); !reflect.DeepEqual(got, want) {
		t.Fatalf("Routes() =\n%+v\nwant\n%+v", got, want)
	}
	if _, err := router.New(cfg.Routes()); err != nil {
		t.Fatalf("router.New: %v", err)
	}
}

// The defaults give the router today's records: every standard header, no
// extra column.
func TestDefaultRoutes(t *testing.T) {
	t.Parallel()
	c := withRequired()
	rc := c.Routes()
	if !reflect.DeepEqual(rc.StandardHeaders, []string{"id", "event_type", "aggregate_type"}) || len(rc.Fields) != 0 ||
		len(rc.Columns()) != 0 || rc.TopicRegex != "" || rc.TombstoneOnEmpty {
		t.Fatalf("default routes %+v", rc)
	}
}

// An empty standard_headers list reaches the router as "none", not as unset
// (which the router reads as all three).
func TestEmptyStandardHeaders(t *testing.T) {
	t.Parallel()
	for _, env := range [][]string{nil, {"OUTBOX_CDC_OUTBOX_STANDARD_HEADERS="}} {
		yaml := requiredYAML
		if env == nil {
			yaml = withRequiredYAML(t, "outbox: {standard_headers: []}")
		}
		cfg, err := Load(writeFile(t, yaml), env)
		if err != nil {
			t.Fatal(err)
		}
		if sh := cfg.Routes().StandardHeaders; sh == nil || len(sh) != 0 {
			t.Errorf("env %v: StandardHeaders %#v, want an empty list", env, sh)
		}
	}
}
