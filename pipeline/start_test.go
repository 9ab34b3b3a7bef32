package pipeline

import "testing"

// TestDecideStart: the later of the slot and the checkpoint is where the
// stream starts; a later committed position (exactly_once) is where
// publishing starts, with the stream left where it was.
func TestDecideStart(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    startReadings
		want startAt
	}{
		{"a new slot", startReadings{slot: 100, created: true}, startAt{stream: 100, skip: 100, from: "slot"}},
		{"the slot ahead of the checkpoint", startReadings{slot: 200, ckpt: 150}, startAt{stream: 200, skip: 200, from: "slot"}},
		{"the slot went back", startReadings{slot: 150, ckpt: 200}, startAt{stream: 200, skip: 200, from: "checkpoint"}},
		{"equal", startReadings{slot: 200, ckpt: 200}, startAt{stream: 200, skip: 200, from: "slot"}},
		{"committed past both", startReadings{slot: 150, ckpt: 180, committed: 300}, startAt{stream: 180, skip: 300, from: "kafka"}},
		{"committed past the slot, no checkpoint", startReadings{slot: 150, committed: 300}, startAt{stream: 150, skip: 300, from: "kafka"}},
		{"committed behind the checkpoint", startReadings{slot: 150, ckpt: 300, committed: 200}, startAt{stream: 300, skip: 300, from: "checkpoint"}},
		{"no committed position (after a tombstone)", startReadings{slot: 150}, startAt{stream: 150, skip: 150, from: "slot"}},
		{"nothing at all", startReadings{}, startAt{stream: 0, skip: 0, from: "slot"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := decideStart(tc.r); got != tc.want {
				t.Fatalf("decideStart(%+v) = %+v, want %+v", tc.r, got, tc.want)
			}
			// Whatever the readings: never below the slot (PostgreSQL would
			// not stream from there), and nothing skipped that is streamed
			// after the start.
			if got := decideStart(tc.r); got.stream < tc.r.slot || got.skip < got.stream {
				t.Fatalf("stream %v below the slot %v, or skip %v below it", got.stream, tc.r.slot, got.skip)
			}
		})
	}
}
