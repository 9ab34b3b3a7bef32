package chaos

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// A hanging transaction (sink/exactlyonce/hanging.go): the broker ended the
// connector's transaction without writing its markers, and the connector
// stopped with the commands that end it. The suite plays that operator:
// what kafka-transactions.sh find-hanging and abort do, on every partition
// of the cluster, then a restart.

// hangingExit reports an exit the connector made on a hanging transaction.
func hangingExit(log string) bool { return strings.Contains(log, "hanging transaction") }

// abortHanging aborts every transaction still open on any partition while
// no connector runs: DescribeProducers lists each partition's producers
// with the start offset of their open transaction, and a WriteTxnMarkers
// abort at that producer's epoch and coordinator epoch, sent to the
// partition's leader, ends it (KIP-664, the Admin client's
// abortTransaction). It returns the partitions it aborted on.
func abortHanging(ctx context.Context) ([]string, error) {
	cl, err := newKafkaClient()
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	actx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	described, err := kadm.NewClient(cl).DescribeProducers(actx, nil)
	if err != nil {
		return nil, fmt.Errorf("describe producers: %w", err)
	}
	var aborted []string
	for _, p := range described.SortedProducers() {
		if p.CurrentTxnStartOffset < 0 {
			continue
		}
		m := kmsg.NewWriteTxnMarkersRequestMarker()
		m.ProducerID, m.ProducerEpoch, m.Committed, m.CoordinatorEpoch = p.ProducerID, p.ProducerEpoch, false, p.CoordinatorEpoch
		t := kmsg.NewWriteTxnMarkersRequestMarkerTopic()
		t.Topic, t.Partitions = p.Topic, []int32{p.Partition}
		m.Topics = append(m.Topics, t)
		req := kmsg.NewPtrWriteTxnMarkersRequest()
		req.Markers = append(req.Markers, m)
		resp, err := req.RequestWith(actx, cl.Broker(int(p.Leader)))
		if err == nil {
			err = firstMarkerError(resp)
		}
		if err != nil {
			return aborted, fmt.Errorf("abort producer %d epoch %d on %s/%d at %d: %w", p.ProducerID, p.ProducerEpoch, p.Topic, p.Partition, p.CurrentTxnStartOffset, err)
		}
		aborted = append(aborted, fmt.Sprintf("%s/%d@%d", p.Topic, p.Partition, p.CurrentTxnStartOffset))
	}
	return aborted, nil
}

func firstMarkerError(resp *kmsg.WriteTxnMarkersResponse) error {
	for _, m := range resp.Markers {
		for _, t := range m.Topics {
			for _, p := range t.Partitions {
				if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
					return err
				}
			}
		}
	}
	return nil
}
