package exactlyonce

import "testing"

func TestTxnEnded(t *testing.T) {
	for _, tc := range []struct {
		name     string
		state    string
		pid      int64
		epoch    int16
		recEpoch int16
		want     bool
	}{
		{"v2: its commit's markers being written", "PrepareCommit", 7, 4, 3, false},
		{"v2: its abort's markers being written", "PrepareAbort", 7, 4, 3, false},
		{"v2: completed (markers written or dropped)", "CompleteCommit", 7, 4, 3, true},
		{"v2: aborted", "CompleteAbort", 7, 4, 3, true},
		{"v2: still open", "Ongoing", 7, 3, 3, false},
		{"a later transaction is open", "Ongoing", 7, 5, 3, true},
		{"a later one is being prepared", "PrepareCommit", 7, 6, 3, true},
		{"a fence since (a start's InitProducerId)", "Empty", 7, 5, 3, true},
		{"v1: open", "Ongoing", 7, 3, 3, false},
		{"v1: being prepared", "PrepareCommit", 7, 3, 3, false},
		{"v1: completed", "CompleteCommit", 7, 3, 3, true},
		{"another producer id (epoch exhausted)", "Ongoing", 8, 0, 3, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := txnEnded(tc.state, tc.pid, tc.epoch, 7, tc.recEpoch); got != tc.want {
				t.Fatalf("txnEnded(%s, pid 7 epoch %d; record epoch %d) = %v, want %v", tc.state, tc.epoch, tc.recEpoch, got, tc.want)
			}
		})
	}
}
