package cli

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/verify"
)

// verifyReports are reports of each shape: clean, with findings, with a
// repair that failed, with one that lifted the hold. Fields are set through
// their promoted names, so the test does not depend on how they nest.
func verifyReports() map[string]*VerifyReport {
	since := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	until := since.Add(time.Hour)
	clean := &VerifyReport{Since: since, Column: "created_at"}
	clean.Topics = []string{"orders"}
	clean.Rows, clean.RecordsRead, clean.Found = 3, 4, 3
	clean.Missing.First, clean.Duplicated.First, clean.OutOfOrder.First = []string{}, []string{}, []string{}
	clean.Seconds = 1.25

	found := &VerifyReport{Since: since, Until: &until, Column: "created_at,at"}
	found.Topics = []string{"a", "b"}
	found.MissingTopics = []string{"b"}
	found.Rows, found.RecordsRead, found.Found, found.DeadLettered = 5, 9, 3, 1
	found.Outside, found.WithoutID = 2, 1
	found.Missing = verify.Finding{Count: 2, First: []string{"id-4", "id-5"}}
	found.Duplicated = verify.Finding{Count: 1, First: []string{"id-1"}}
	found.OutOfOrder = verify.Finding{Count: 1, First: []string{"id-2"}}
	found.Seconds = 0.04

	failed := &VerifyReport{Since: since, Column: "created_at"}
	*failed = *found
	failed.Repair = &RepairReport{Published: 1, Failed: 1, Error: "kafka: boom"}

	lifted := &VerifyReport{Since: since, Column: "created_at"}
	*lifted = *found
	lifted.Until = nil
	lifted.Repair = &RepairReport{Published: 1, Parked: 1, HoldCleared: true}
	return map[string]*VerifyReport{"clean": clean, "found": found, "failed": failed, "lifted": lifted}
}

// TestVerifyOutput pins the text and JSON verify prints.
func TestVerifyOutput(t *testing.T) {
	for name, rep := range verifyReports() {
		var text bytes.Buffer
		printVerify(&text, rep)
		if got := text.String(); got != wantVerifyText[name] {
			t.Errorf("%s: text\n%s\nwant\n%s", name, got, wantVerifyText[name])
		}
		js, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if got := string(js); got != wantVerifyJSON[name] {
			t.Errorf("%s: json\n%s\nwant\n%s", name, got, wantVerifyJSON[name])
		}
	}
}

var wantVerifyText = map[string]string{
	"clean": `rows            3 (created_at from 2025-06-01T12:00:00Z, no end)
topics          orders
records read    4 (0 outside the range, 0 without id)
found           3 (0 in the dead-letter or parking topic)
missing         0
duplicated      0
out of order    0
took            1.2s
`,
	"failed": `rows            5 (created_at,at from 2025-06-01T12:00:00Z, 2025-06-01T13:00:00Z)
topics          a, b
missing topics  b
records read    9 (2 outside the range, 1 without id)
found           3 (1 in the dead-letter or parking topic)
missing         2 (first: id-4 id-5)
duplicated      1 (first: id-1)
out of order    1 (first: id-2)
republished     1 (0 to the dead-letter topic, 0 parked behind a quarantine, 1 failed)
repair error    kafka: boom
took            0.0s
`,
	"found": `rows            5 (created_at,at from 2025-06-01T12:00:00Z, 2025-06-01T13:00:00Z)
topics          a, b
missing topics  b
records read    9 (2 outside the range, 1 without id)
found           3 (1 in the dead-letter or parking topic)
missing         2 (first: id-4 id-5)
duplicated      1 (first: id-1)
out of order    1 (first: id-2)
took            0.0s
`,
	"lifted": `rows            5 (created_at,at from 2025-06-01T12:00:00Z, no end)
topics          a, b
missing topics  b
records read    9 (2 outside the range, 1 without id)
found           3 (1 in the dead-letter or parking topic)
missing         2 (first: id-4 id-5)
duplicated      1 (first: id-1)
out of order    1 (first: id-2)
republished     2 (0 to the dead-letter topic, 1 parked behind a quarantine, 0 failed)
retention       the lost slot's hold is cleared: outbox retention deletes these rows again once delivered
took            0.0s
`,
}

var wantVerifyJSON = map[string]string{
	"clean": `{
  "since": "2025-06-01T12:00:00Z",
  "column": "created_at",
  "topics": [
    "orders"
  ],
  "rows": 3,
  "records_read": 4,
  "found": 3,
  "dead_lettered": 0,
  "records_outside_range": 0,
  "records_without_id": 0,
  "missing": {
    "count": 0,
    "first": []
  },
  "duplicated": {
    "count": 0,
    "first": []
  },
  "out_of_order": {
    "count": 0,
    "first": []
  },
  "seconds": 1.25
}`,
	"failed": `{
  "since": "2025-06-01T12:00:00Z",
  "until": "2025-06-01T13:00:00Z",
  "column": "created_at,at",
  "topics": [
    "a",
    "b"
  ],
  "missing_topics": [
    "b"
  ],
  "rows": 5,
  "records_read": 9,
  "found": 3,
  "dead_lettered": 1,
  "records_outside_range": 2,
  "records_without_id": 1,
  "missing": {
    "count": 2,
    "first": [
      "id-4",
      "id-5"
    ]
  },
  "duplicated": {
    "count": 1,
    "first": [
      "id-1"
    ]
  },
  "out_of_order": {
    "count": 1,
    "first": [
      "id-2"
    ]
  },
  "repair": {
    "published": 1,
    "dead_lettered": 0,
    "parked": 0,
    "failed": 1,
    "error": "kafka: boom"
  },
  "seconds": 0.04
}`,
	"found": `{
  "since": "2025-06-01T12:00:00Z",
  "until": "2025-06-01T13:00:00Z",
  "column": "created_at,at",
  "topics": [
    "a",
    "b"
  ],
  "missing_topics": [
    "b"
  ],
  "rows": 5,
  "records_read": 9,
  "found": 3,
  "dead_lettered": 1,
  "records_outside_range": 2,
  "records_without_id": 1,
  "missing": {
    "count": 2,
    "first": [
      "id-4",
      "id-5"
    ]
  },
  "duplicated": {
    "count": 1,
    "first": [
      "id-1"
    ]
  },
  "out_of_order": {
    "count": 1,
    "first": [
      "id-2"
    ]
  },
  "seconds": 0.04
}`,
	"lifted": `{
  "since": "2025-06-01T12:00:00Z",
  "column": "created_at,at",
  "topics": [
    "a",
    "b"
  ],
  "missing_topics": [
    "b"
  ],
  "rows": 5,
  "records_read": 9,
  "found": 3,
  "dead_lettered": 1,
  "records_outside_range": 2,
  "records_without_id": 1,
  "missing": {
    "count": 2,
    "first": [
      "id-4",
      "id-5"
    ]
  },
  "duplicated": {
    "count": 1,
    "first": [
      "id-1"
    ]
  },
  "out_of_order": {
    "count": 1,
    "first": [
      "id-2"
    ]
  },
  "repair": {
    "published": 1,
    "dead_lettered": 0,
    "parked": 1,
    "failed": 0,
    "hold_cleared": true
  },
  "seconds": 0.04
}`,
}

// TestVerifyExit: without --repair a missing row fails verify; with it,
// only a repair that did not republish every missing row does.
func TestVerifyExit(t *testing.T) {
	missing := func(n int64, repair *RepairReport) *VerifyReport {
		r := &VerifyReport{}
		r.Missing.Count, r.Repair = n, repair
		return r
	}
	tests := []struct {
		name string
		rep  *VerifyReport
		want int
	}{
		{"clean", missing(0, nil), ExitOK},
		{"missing", missing(2, nil), ExitFailure},
		{"repaired", missing(2, &RepairReport{Published: 1, DeadLettered: 1}), ExitOK},
		{"repaired, one parked", missing(2, &RepairReport{Published: 1, Parked: 1}), ExitOK},
		{"one failed", missing(2, &RepairReport{Published: 1, Failed: 1}), ExitFailure},
		{"one short", missing(2, &RepairReport{Published: 1}), ExitFailure},
		{"an error", missing(1, &RepairReport{Published: 1, Error: "flush: boom"}), ExitFailure},
		{"nothing to repair", missing(0, &RepairReport{}), ExitOK},
	}
	for _, tc := range tests {
		if got := verifyExit(tc.rep); got != tc.want {
			t.Errorf("%s: exit %d, want %d", tc.name, got, tc.want)
		}
	}
}
