package router

import (
	"strings"
	"testing"

	"github.com/outbox-cdc/outbox-cdc/decode"
)

// TestOptionsCombine routes one row through the EventRouter options, the
// trace column and a CloudEvents format together: each keeps its part of
// the record (a tombstone stays nil, the trace headers come before the ce_
// ones, an aliased header survives the shaping).
func TestOptionsCombine(t *testing.T) {
	const parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	base := event()
	base.PayloadFormat = decode.PayloadJSON
	base.Headers = []decode.Header{{Name: "trace", Value: val(parent)}}
	base.Columns = []decode.Column{{Name: "tenant", Value: val("acme")}}
	empty := base
	empty.Payload = val("  ")
	cfg := Config{Format: FormatCEStructured, CloudEvents: CloudEvents{Source: testSource}, TraceColumn: "trace",
		Fields: []Field{{Column: "tenant", Placement: PlaceHeader, Alias: "tenantId"}}, StandardHeaders: []string{"id"},
		TombstoneOnEmpty: true}

	for _, tc := range []struct {
		name      string
		ev        decode.Event
		tombstone bool
	}{{"structured", base, false}, {"empty payload: a tombstone, shaped in binary mode", empty, true}} {
		t.Run(tc.name, func(t *testing.T) {
			r := mustNew(t, cfg)
			var rec Record
			if reason := r.RouteFrom(&tc.ev, Source{Commit: commitTime}, &rec); reason != "" {
				t.Fatalf("RouteFrom: %s", reason)
			}
			if (rec.Value == nil) != tc.tombstone {
				t.Fatalf("value %q, tombstone %v", rec.Value, tc.tombstone)
			}
			var keys []string
			for _, h := range rec.Headers {
				keys = append(keys, h.Key)
			}
			got := strings.Join(keys, ",")
			want := "id,tenantId,traceparent,content-type"
			if tc.tombstone {
				want = "id,tenantId,traceparent,ce_specversion,ce_id,ce_source,ce_type,ce_subject,ce_time,ce_partitionkey"
			}
			if got != want {
				t.Errorf("headers %s, want %s", got, want)
			}
			checkBinding(t, &rec)
		})
	}
	envelope := cfg
	envelope.TopicTemplate, envelope.DLQTopic = defTemplate, defDLQ
	envelope.Fields = append(envelope.Fields, Field{Column: "tenant", Placement: PlaceEnvelope, Alias: "tenant"})
	if _, err := New(envelope); err == nil || !strings.Contains(err.Error(), "envelope placement with kafka.format") {
		t.Errorf("an envelope with a CloudEvents format: %v, want refused", err)
	}
}
