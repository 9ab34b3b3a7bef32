package integration

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// cutoverFilter returns the snapshot.filter docs/operations.md gives for a
// cut-over from a polling relay.
func cutoverFilter(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "## Cut-over from a polling relay")
	if !ok {
		t.Fatal(`docs/operations.md has no "Cut-over from a polling relay"`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	m := regexp.MustCompile("`snapshot.filter: ([^`]+)`").FindStringSubmatch(section)
	if m == nil {
		t.Fatal("the cut-over section gives no `snapshot.filter: …`")
	}
	return m[1]
}

// TestCutoverFromPollingRelay follows docs/operations.md's cut-over from a
// relay built like the seeds' (statuses PENDING, PROCESSING, SENT, RETRY,
// DEAD): every row the relay had not sent is published, the sent ones not.
func TestCutoverFromPollingRelay(t *testing.T) {
	filter := cutoverFilter(t)
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	exec1(t, dsn, `ALTER TABLE outbox ADD COLUMN status text NOT NULL DEFAULT 'PENDING',
		ADD COLUMN retry_count int NOT NULL DEFAULT 0, ADD COLUMN next_retry_at timestamptz,
		ADD COLUMN locked_by text, ADD COLUMN locked_until timestamptz, ADD COLUMN last_error text`)
	exec1(t, dsn, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, status, retry_count, next_retry_at, locked_by, locked_until, last_error)
		VALUES ('cutover', 'o-1', 'E', '{"state": "SENT"}', 'SENT', 0, NULL, NULL, NULL, NULL),
		       ('cutover', 'o-1', 'E', '{"state": "PENDING"}', 'PENDING', 0, NULL, NULL, NULL, NULL),
		       ('cutover', 'o-2', 'E', '{"state": "PROCESSING"}', 'PROCESSING', 0, NULL, 'relay-1', now() + interval '30 seconds', NULL),
		       ('cutover', 'o-3', 'E', '{"state": "RETRY"}', 'RETRY', 3, now() + interval '8 seconds', NULL, NULL, 'broker timeout'),
		       ('cutover', 'o-4', 'E', '{"state": "DEAD"}', 'DEAD', 10, NULL, NULL, NULL, 'too large')`)
	cfg := testConfig(t, dsn, "public.outbox", "cutover")
	cfg.Snapshot.Mode, cfg.Snapshot.Filter = "pending", filter
	startConnector(t, cfg)
	recs := consumeN(t, []string{topicFor("cutover")}, 3, time.Minute, 2*time.Second)
	var got []string
	for _, r := range recs {
		got = append(got, string(r.Value))
	}
	slices.Sort(got)
	want := []string{`{"state": "PENDING"}`, `{"state": "PROCESSING"}`, `{"state": "RETRY"}`}
	if !slices.Equal(got, want) {
		t.Fatalf("with snapshot.filter %q the cut-over published %v, want every unsent row once: %v", filter, got, want)
	}
}
