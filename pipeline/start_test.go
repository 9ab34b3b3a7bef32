package pipeline

import (
	"errors"
	"testing"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// TestDecideStart: the later of the slot and the checkpoint is where the
// stream starts; a later committed position (exactly_once) is where
// publishing starts, with the stream left where it was. A saved position
// whose history mark the server lacks is refused, whatever else is read; a
// committed position its mark does not reach is trusted up to the mark and
// read back past it.
func TestDecideStart(t *testing.T) {
	found := func(id uint64, at uint64) markReading { return markReading{id: id, at: lsn.LSN(at), found: true} }
	lost := func(id uint64, at uint64) markReading { return markReading{id: id, at: lsn.LSN(at)} }
	for _, tc := range []struct {
		name    string
		r       startReadings
		want    startAt
		refused string // "checkpoint" or "kafka"
	}{
		{name: "a new slot", r: startReadings{slot: 100, created: true},
			want: startAt{stream: 100, skip: 100, from: "slot", proof: proof{at: 100}}},
		{name: "the slot ahead of the checkpoint", r: startReadings{slot: 200, ckpt: 150},
			want: startAt{stream: 200, skip: 200, from: "slot", proof: proof{at: 200}}},
		{name: "the slot went back", r: startReadings{slot: 150, ckpt: 200},
			want: startAt{stream: 200, skip: 200, from: "checkpoint", proof: proof{at: 200}}},
		{name: "equal", r: startReadings{slot: 200, ckpt: 200},
			want: startAt{stream: 200, skip: 200, from: "slot", proof: proof{at: 200}}},
		{name: "committed past both", r: startReadings{slot: 150, ckpt: 180, committed: 300},
			want: startAt{stream: 180, skip: 300, from: "kafka", proof: proof{at: 300}}},
		{name: "committed past the slot, no checkpoint", r: startReadings{slot: 150, committed: 300},
			want: startAt{stream: 150, skip: 300, from: "kafka", proof: proof{at: 300}}},
		{name: "committed behind the checkpoint", r: startReadings{slot: 150, ckpt: 300, committed: 200},
			want: startAt{stream: 300, skip: 300, from: "checkpoint", proof: proof{at: 300}}},
		{name: "no committed position (after a tombstone)", r: startReadings{slot: 150},
			want: startAt{stream: 150, skip: 150, from: "slot", proof: proof{at: 150}}},
		{name: "nothing at all", r: startReadings{}, want: startAt{from: "slot"}},

		{name: "a marked checkpoint the server has", r: startReadings{slot: 150, ckpt: 200, ckptMark: found(7, 210)},
			want: startAt{stream: 200, skip: 200, from: "checkpoint", proof: proof{mark: 7, at: 200}}},
		{name: "its mark proves the slot ahead of it", r: startReadings{slot: 205, ckpt: 200, ckptMark: found(7, 210)},
			want: startAt{stream: 205, skip: 205, from: "slot", proof: proof{mark: 7, at: 205}}},
		{name: "the slot past its mark: no mark for the reconnect", r: startReadings{slot: 300, ckpt: 200, ckptMark: found(7, 210)},
			want: startAt{stream: 300, skip: 300, from: "slot", proof: proof{at: 300}}},
		{name: "a checkpoint whose mark the server lacks (a restore, its WAL past it again)",
			r: startReadings{slot: 150, ckpt: 200, ckptMark: lost(7, 210)}, refused: "checkpoint"},
		{name: "behind the slot, it decides nothing: the slot is the server's own", r: startReadings{slot: 300, ckpt: 200,
			ckptMark: lost(7, 210)}, want: startAt{stream: 300, skip: 300, from: "slot", proof: proof{at: 300}}},
		{name: "a committed position its mark proves", r: startReadings{slot: 150, committed: 300, committedMark: found(9, 300)},
			want: startAt{stream: 150, skip: 300, from: "kafka", proof: proof{mark: 9, at: 300}}},
		{name: "a committed position past its mark: trusted to the mark, read back past it",
			r:    startReadings{slot: 150, committed: 300, committedMark: found(9, 250)},
			want: startAt{stream: 150, skip: 250, from: "kafka-proof", proof: proof{mark: 9, at: 250}, readBack: true}},
		{name: "its mark behind the stream's start", r: startReadings{slot: 150, ckpt: 260, ckptMark: found(3, 270), committed: 300,
			committedMark: found(9, 250)},
			want: startAt{stream: 260, skip: 260, from: "kafka-proof", proof: proof{mark: 3, at: 260}, readBack: true}},
		{name: "a committed position whose mark the server lacks", r: startReadings{slot: 150, committed: 300,
			committedMark: lost(9, 300)}, refused: "kafka"},
		{name: "behind the checkpoint, it decides nothing (a position of an exactly_once period long ago)",
			r:    startReadings{slot: 150, ckpt: 400, committed: 300, committedMark: lost(9, 300)},
			want: startAt{stream: 400, skip: 400, from: "checkpoint", proof: proof{at: 400}}},
		{name: "the run's own mark proves a start no saved mark proves", r: startReadings{slot: 0x2000, created: true,
			fresh: found(5, 0x2100)}, want: startAt{stream: 0x2000, skip: 0x2000, from: "slot", proof: proof{mark: 5, at: 0x2000}}},
		{name: "a mark written before the slot proves nothing of it", r: startReadings{slot: 0x2000, created: true,
			fresh: found(5, 0x1f00)}, want: startAt{stream: 0x2000, skip: 0x2000, from: "slot", proof: proof{at: 0x2000}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := decideStart(tc.r)
			var nh *notInHistory
			switch {
			case tc.refused != "":
				if !errors.As(err, &nh) || nh.what != tc.refused {
					t.Fatalf("decideStart(%+v) = %+v, %v; want the %s refused", tc.r, got, err, tc.refused)
				}
				return
			case err != nil:
				t.Fatalf("decideStart(%+v): %v", tc.r, err)
			case got != tc.want:
				t.Fatalf("decideStart(%+v) = %+v, want %+v", tc.r, got, tc.want)
			}
			// Whatever the readings: never below the slot (PostgreSQL would
			// not stream from there), nothing skipped that is streamed after
			// the start, and the proof at the skip position.
			if got.stream < tc.r.slot || got.skip < got.stream || got.proof.at != got.skip {
				t.Fatalf("stream %v below the slot %v, skip %v below it, or proof %v not at it", got.stream, tc.r.slot, got.skip, got.proof)
			}
		})
	}
}
