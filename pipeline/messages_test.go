package pipeline

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outbox-cdc/outbox-cdc/decode"
	"github.com/outbox-cdc/outbox-cdc/internal/metrics"
)

// TestIgnoredMessagesCountedAndWarned: logical messages the pipeline does not
// publish are counted by prefix, and one carrying an outbox event (a
// misconfigured prefix, a non-transactional emit) is warned about once.
func TestIgnoredMessagesCountedAndWarned(t *testing.T) {
	var logs bytes.Buffer
	pp := &Pipeline{cfg: Config{MessagePrefix: "outbox"}, m: metrics.New(), log: slog.New(slog.NewTextHandler(&logs, nil))}
	p := &processor{p: pp}
	event := []byte(`{"id":"e-1","aggregate_type":"order","aggregate_id":"o-1","event_type":"OrderPlaced","payload":{}}`)
	for range 3 {
		p.ignoreMessage(&decode.Message{Transactional: true, Prefix: "outbx", Content: event})
	}
	p.ignoreMessage(&decode.Message{Transactional: true, Prefix: "heartbeat", Content: []byte("tick")})
	p.ignoreMessage(&decode.Message{Transactional: false, Prefix: "outbox", Content: event})
	for prefix, want := range map[string]float64{"outbx": 3, "heartbeat": 1, "outbox": 1} {
		if got := testutil.ToFloat64(pp.m.MessagesIgnored.WithLabelValues(prefix)); got != want {
			t.Errorf("ignored{prefix=%q} = %v, want %v", prefix, got, want)
		}
	}
	out := logs.String()
	if n := strings.Count(out, "prefix=outbx"); n != 1 {
		t.Errorf("%d warnings for prefix outbx, want 1:\n%s", n, out)
	}
	if strings.Contains(out, "prefix=heartbeat") {
		t.Errorf("warned about a message that is not an outbox event:\n%s", out)
	}
	if !strings.Contains(out, "not transactional") {
		t.Errorf("no warning for the non-transactional outbox event:\n%s", out)
	}

	// The label set is bounded: prefixes beyond the limit share one label.
	for i := range maxIgnoredPrefixes + 5 {
		p.ignoreMessage(&decode.Message{Transactional: true, Prefix: strings.Repeat("p", i+1), Content: []byte("x")})
	}
	if got := testutil.CollectAndCount(pp.m.MessagesIgnored); got != maxIgnoredPrefixes+1 {
		t.Errorf("%d label values, want %d (the limit and %q)", got, maxIgnoredPrefixes+1, otherPrefixes)
	}
}
