package integration

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/outbox-cdc/outbox-cdc/sink/quarantine"
)

// TestRedriveRefusesDeletedParkedEvents: 50 events of agg-1 are parked
// behind its dead letter; then the parking topic's log start moves past
// some of them (retention, here DeleteRecords) or past all of them. The
// redrive refuses, exit 1 naming the deleted offsets and --skip; the
// quarantine stays and nothing reaches the topic. --skip then lifts it
// with the parked events still there, in order, without the dead letter.
func TestRedriveRefusesDeletedParkedEvents(t *testing.T) {
	const parked = 50
	for _, tc := range []struct {
		name string
		keep int64 // parked records left on the parking topic
	}{{"partly deleted", 25}, {"all deleted", 0}} {
		t.Run(tc.name, func(t *testing.T) {
			q := newQuarantineSetup(t, "qgone"+map[bool]string{true: "all", false: "part"}[tc.keep == 0])
			p, conn := q.start(t)
			if _, err := conn.Exec(context.Background(), `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
				SELECT 'limited', 'agg-1', 'Sized', CASE WHEN i = 1 THEN jsonb_build_object('seq', i, 'blob', repeat('x', $1::int))
					ELSE jsonb_build_object('seq', i) END
				FROM generate_series(1, $2::int) AS i ORDER BY i`, 2*lowered, parked+1); err != nil {
				t.Fatal(err)
			}
			consumeN(t, []string{q.parking}, parked, 2*time.Minute, time.Second)
			lowerLimit(t, q.topic, 1<<20) // the cause is fixed: only the deletion stands in the way
			deleteParked(t, q.parking, tc.keep)

			code, out := q.redrive(t, "--aggregate", "agg-1", "--wait", "1m")
			if code != 1 || !strings.Contains(out, "were deleted") || !strings.Contains(out, "offsets") || !strings.Contains(out, "--skip") {
				t.Fatalf("redrive with parked events deleted: exit %d, want 1 naming the deleted offsets and --skip:\n%s", code, out)
			}
			if ls := q.list(t); len(ls) != 1 || ls[0].Key != "agg-1" || ls[0].State != quarantine.StateFailed {
				t.Fatalf("after the refusal: %+v, want agg-1 quarantined with the failure", ls)
			}
			if got := firstSeqs(t, consumeN(t, []string{q.topic}, 1, time.Minute, 2*time.Second), "agg-1"); len(got) != 0 {
				t.Fatalf("topic holds agg-1 %v after the refusal, want nothing", got)
			}

			if code, out := q.redrive(t, "--aggregate", "agg-1", "--skip"); code != 0 || !strings.Contains(out, "quarantine lifted") {
				t.Fatalf("redrive --skip: exit %d:\n%s", code, out)
			}
			want := seqRange(parked+2-int(tc.keep), parked+1) // the parked events left
			got := firstSeqs(t, consumeN(t, []string{q.topic}, 1+len(want), time.Minute, 2*time.Second), "agg-1")
			if !slices.Equal(got, want) {
				t.Fatalf("topic holds agg-1 %v after --skip, want %v", got, want)
			}
			stopClean(t, p)
		})
	}
}

// deleteParked moves the log start of each partition of topic holding
// records to keep records before its end.
func deleteParked(t *testing.T, topic string, keep int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	adm := newAdmin(t)
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatalf("end offsets of %s: %v", topic, err)
	}
	to := kadm.Offsets{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err == nil && o.Offset > 0 {
			to.AddOffset(topic, o.Partition, max(o.Offset-keep, 0), -1)
		}
	})
	resp, err := adm.DeleteRecords(ctx, to)
	if err == nil {
		resp.Each(func(r kadm.DeleteRecordsResponse) {
			if err == nil {
				err = r.Err
			}
		})
	}
	if err != nil {
		t.Fatalf("delete records of %s: %v", topic, err)
	}
}
