package exactlyonce_test

import (
	"context"
	"slices"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outbox-cdc/outbox-cdc/sink"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/sinktest"
)

// r5Redrive asks for k's redrive with a state client of cfg and waits
// for the answer.
func r5Redrive(ctx context.Context, t *testing.T, cfg sink.Config, k string, skip bool) error {
	t.Helper()
	sc, err := sink.NewStateClient(cfg)
	if err != nil {
		t.Fatalf("state client: %v", err)
	}
	defer sc.Close()
	return sc.Redrive(ctx, k, skip)
}

// TestReview5RedriveReadsParkingBeforeMarkers: Kafka's coordinator answers
// EndTxn once PREPARE_COMMIT is durable and writes the partitions' markers
// after it (topicread.Await's own doc says so; readDeadLetter waits for its
// marker for this reason, redrive.go:291). readParked (redrive.go:355)
// passes no Holds: a parked record whose transaction's marker is not
// written yet when the redrive lists the parking topic's end
// (ListEndOffsets: the high watermark, before the marker) is taken for an
// open transaction and left out. redriveTxn runs right after the
// producer's last commit (Transact takes commitMu as soon as it is free),
// so the event parked by that commit is not republished, the quarantine is
// tombstoned, and the event stays on the parking topic under a lifted
// quarantine: LOSS.
//
// kfake writes markers within EndTxn, so the window is reproduced by
// answering the redrive's ListOffsets(latest) of the parking topic as a
// broker does between the EndTxn answer and the marker write: the end is
// the marker's offset.
func TestReview5RedriveReadsParkingBeforeMarkers(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := r5Cluster(ctx, t)
	cfg := r5Config(c)
	tx, _ := r5Txn(ctx, t, cfg)
	r5Hand(ctx, t, tx, 100, r5Event(r5Small, "k", "e1", true), r5Event(r5Small, "k", "e2", false))
	r5Hand(ctx, t, tx, 200, r5Event(r5Small, "k", "e3", false)) // parked, alone in the last commit

	parked := readCommitted(ctx, t, c, r5Parking, true, false)
	if got := r5IDs(parked, "k"); !slices.Equal(got, []string{"e2", "e3"}) {
		t.Fatalf("parking holds %v, want [e2 e3]", got)
	}
	last := parked[len(parked)-1]
	adm := kadm.NewClient(sinktest.Admin(t, c))
	ends, err := adm.ListEndOffsets(ctx, r5Parking)
	if err != nil {
		t.Fatalf("end offsets: %v", err)
	}
	hwm := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) { hwm[o.Partition] = o.Offset })
	if hwm[last.Partition] != last.Offset+2 {
		t.Fatalf("parking partition %d ends at %d, want e3 at %d then its marker", last.Partition, hwm[last.Partition], last.Offset)
	}
	// The end a broker lists before e3's commit marker is written.
	hwm[last.Partition] = last.Offset + 1
	c.ControlKey(int16(kmsg.ListOffsets), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kr.(*kmsg.ListOffsetsRequest)
		if len(req.Topics) != 1 || req.Topics[0].Topic != r5Parking || len(req.Topics[0].Partitions) == 0 ||
			req.Topics[0].Partitions[0].Timestamp != -1 {
			return nil, nil, false
		}
		resp := req.ResponseKind().(*kmsg.ListOffsetsResponse)
		rt := kmsg.NewListOffsetsResponseTopic()
		rt.Topic = r5Parking
		for _, p := range req.Topics[0].Partitions {
			rp := kmsg.NewListOffsetsResponseTopicPartition()
			rp.Partition, rp.Offset, rp.Timestamp, rp.LeaderEpoch = p.Partition, hwm[p.Partition], -1, 0
			rt.Partitions = append(rt.Partitions, rp)
		}
		resp.Topics = append(resp.Topics, rt)
		return resp, nil, true
	})

	if err := r5Redrive(ctx, t, cfg.Sink, "k", true); err != nil {
		t.Fatalf("redrive: %v", err)
	}
	got := r5IDs(readCommitted(ctx, t, c, r5Small, true, false), "k")
	if !slices.Equal(got, []string{"e2", "e3"}) {
		st := r5States(ctx, t, c, "k")
		t.Fatalf("LOSS: after the redrive %s holds %v of k, want [e2 e3] (redrive --skip: e1 stays a dead letter); k's last state record %+v (nil: lifted); e3 stays parked under a lifted quarantine",
			r5Small, got, st[len(st)-1])
	}
}
