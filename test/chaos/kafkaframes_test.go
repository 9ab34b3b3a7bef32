package chaos

import (
	"encoding/binary"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// TestEndTxnFrames: the proxy's parser finds EndTxn in request frames of
// every version as franz-go encodes them, and its rewrites of an EndTxn
// and a Produce answer decode as the forged errors, the rest intact.
func TestEndTxnFrames(t *testing.T) {
	f := kmsg.NewRequestFormatter(kmsg.FormatterClientID("outbox-cdc"))
	for v := int16(0); v <= 5; v++ {
		for _, commit := range []bool{true, false} {
			req := kmsg.NewPtrEndTxnRequest()
			req.SetVersion(v)
			req.TransactionalID, req.ProducerID, req.ProducerEpoch, req.Commit = "outbox-cdc-7/db/slot", 42, 3, commit
			frame := f.AppendRequest(nil, req, 77)
			corr, flexible, gotCommit, ok := testenv.EndTxnRequest(frame)
			if !ok || corr != 77 || flexible != req.IsFlexible() || gotCommit != commit {
				t.Fatalf("v%d commit=%v: parsed corr %d flexible %v commit %v ok %v", v, commit, corr, flexible, gotCommit, ok)
			}
		}
		resp := kmsg.NewPtrEndTxnResponse()
		resp.SetVersion(v)
		body := resp.AppendTo(nil)
		frame := binary.BigEndian.AppendUint32(make([]byte, 4), 77)
		if resp.IsFlexible() {
			frame = append(frame, 0) // no tagged fields in the header
		}
		frame = append(frame, body...)
		binary.BigEndian.PutUint32(frame, uint32(len(frame)-4))
		p := &Proxy{}
		p.answer(&frameLink{forge: map[int32]bool{77: resp.IsFlexible()}}, frame)
		got := kmsg.NewPtrEndTxnResponse()
		got.SetVersion(v)
		at := 8
		if resp.IsFlexible() {
			at++
		}
		if err := got.ReadFrom(frame[at:]); err != nil || got.ErrorCode != coordinatorLoadInProgress {
			t.Fatalf("v%d: forged answer reads %+v (%v)", v, got, err)
		}
	}
	for v := int16(3); v <= 13; v++ {
		resp := kmsg.NewPtrProduceResponse()
		resp.SetVersion(v)
		rt := kmsg.NewProduceResponseTopic()
		rt.Topic, rt.TopicID = "outbox.event.order", [16]byte{1, 2, 3}
		rp := kmsg.NewProduceResponseTopicPartition()
		rp.Partition, rp.BaseOffset = 2, 99
		rt.Partitions = append(rt.Partitions, rp)
		resp.Topics = append(resp.Topics, rt)
		frame := binary.BigEndian.AppendUint32(make([]byte, 4), 78)
		at := 8
		if resp.IsFlexible() {
			frame = append(frame, 0)
			at++
		}
		frame = append(frame, resp.AppendTo(nil)...)
		binary.BigEndian.PutUint32(frame, uint32(len(frame)-4))
		p := &Proxy{}
		p.answer(&frameLink{forge: map[int32]bool{}, produce: map[int32]int16{78: v}}, frame)
		got := kmsg.NewPtrProduceResponse()
		got.SetVersion(v)
		if err := got.ReadFrom(frame[at:]); err != nil || len(got.Topics) != 1 || len(got.Topics[0].Partitions) != 1 ||
			got.Topics[0].Partitions[0].ErrorCode != policyViolation || got.Topics[0].Partitions[0].BaseOffset != 99 {
			t.Fatalf("v%d: forged Produce answer reads %+v (%v)", v, got, err)
		}
	}
	meta := f.AppendRequest(nil, kmsg.NewPtrMetadataRequest(), 1)
	if _, _, _, ok := testenv.EndTxnRequest(meta); ok {
		t.Fatal("a Metadata request parsed as EndTxn")
	}
}
