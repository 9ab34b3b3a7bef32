package chaos

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// A hanging transaction (sink/exactlyonce/hanging.go): the broker ended the
// connector's transaction without writing its markers on some of its
// partitions, and the connector stopped with a runbook that names each of
// them. The suite plays that operator: it follows the runbook as printed,
// partition by partition, then restarts the connector.

// hangingExit reports an exit the connector made on a hanging transaction.
func hangingExit(log string) bool { return strings.Contains(log, "hanging transaction") }

var (
	// kafka-transactions.sh … abort --topic T --partition P --start-offset O
	runbookAbort = regexp.MustCompile(`abort --topic ([A-Za-z0-9._-]+) --partition (\d+) --start-offset (\d+)`)
	// COMMIT marker on T/P (producer id X, its transaction from offset O)
	runbookCommit = regexp.MustCompile(`COMMIT marker on ([A-Za-z0-9._-]+)/(\d+) \(producer id \d+, its transaction from offset (\d+)\)`)
)

// runbookStep is one partition's step of the runbook.
type runbookStep struct {
	commit    bool
	topic     string
	partition int32
	start     int64
}

func (s runbookStep) String() string {
	what := "aborted"
	if s.commit {
		what = "committed"
	}
	return fmt.Sprintf("%s %s/%d@%d", what, s.topic, s.partition, s.start)
}

// parseRunbook reads the steps of the last hanging-transaction runbook in
// log (the connector logs it, then exits with it). A runbook that leaves
// the outcome to the operator (the marker elsewhere decides) is an error:
// the suite does not read markers.
func parseRunbook(log string) ([]runbookStep, error) {
	var line string
	for l := range strings.SplitSeq(log, "\n") {
		if hangingExit(l) {
			line = l
		}
	}
	if line == "" {
		return nil, errors.New("no hanging-transaction runbook in the connector's log")
	}
	if strings.Contains(line, "its outcome could not be learned here") {
		return nil, fmt.Errorf("the runbook leaves the outcome to the operator: %s", line)
	}
	var steps []runbookStep
	add := func(commit bool, m []string) {
		p, _ := strconv.ParseInt(m[2], 10, 32)
		o, _ := strconv.ParseInt(m[3], 10, 64)
		s := runbookStep{commit: commit, topic: m[1], partition: int32(p), start: o}
		for _, had := range steps {
			if had == s {
				return
			}
		}
		steps = append(steps, s)
	}
	for _, m := range runbookAbort.FindAllStringSubmatch(line, -1) {
		add(false, m)
	}
	for _, m := range runbookCommit.FindAllStringSubmatch(line, -1) {
		add(true, m)
	}
	if len(steps) == 0 {
		return nil, fmt.Errorf("no step in the runbook: %s", line)
	}
	return steps, nil
}

// abortHanging follows the runbook in the connector's log while no
// connector runs, and returns what it did. An abort is what
// kafka-transactions.sh abort --start-offset does (KIP-664, the Admin
// client's abortTransaction): DescribeProducers on the partition, the
// producer whose open transaction starts there, and a WriteTxnMarkers
// abort at its epoch and coordinator epoch, sent to the partition's
// leader. A COMMIT marker, which no kafka-transactions.sh command writes,
// is the same request with committed=true.
func abortHanging(ctx context.Context, log ...string) ([]string, error) {
	steps, err := parseRunbook(strings.Join(log, "\n"))
	if err != nil {
		return nil, err
	}
	cl, err := newKafkaClient()
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	actx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var done []string
	for _, s := range steps {
		what, err := endOpen(actx, cl, s)
		if err != nil {
			return done, fmt.Errorf("runbook step %v: %w", s, err)
		}
		done = append(done, what)
	}
	return done, nil
}

// endOpen writes step s's marker on the producer whose transaction is open
// at its start offset; none open there (its marker came late) is no error.
func endOpen(ctx context.Context, cl *kgo.Client, s runbookStep) (string, error) {
	described, err := kadm.NewClient(cl).DescribeProducers(ctx, kadm.TopicsSet{s.topic: {s.partition: {}}})
	if err != nil {
		return "", fmt.Errorf("describe producers: %w", err)
	}
	for _, p := range described.SortedProducers() {
		if p.CurrentTxnStartOffset != s.start {
			continue
		}
		m := kmsg.NewWriteTxnMarkersRequestMarker()
		m.ProducerID, m.ProducerEpoch, m.Committed, m.CoordinatorEpoch = p.ProducerID, p.ProducerEpoch, s.commit, p.CoordinatorEpoch
		t := kmsg.NewWriteTxnMarkersRequestMarkerTopic()
		t.Topic, t.Partitions = p.Topic, []int32{p.Partition}
		m.Topics = append(m.Topics, t)
		req := kmsg.NewPtrWriteTxnMarkersRequest()
		req.Markers = append(req.Markers, m)
		resp, err := req.RequestWith(ctx, cl.Broker(int(p.Leader)))
		if err == nil {
			err = firstMarkerError(resp)
		}
		if err != nil {
			return "", fmt.Errorf("producer %d epoch %d: %w", p.ProducerID, p.ProducerEpoch, err)
		}
		return s.String(), nil
	}
	return fmt.Sprintf("%v: none open there any more", s), nil
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

// TestParseRunbook: the suite's operator reads each partition's step of the
// runbook the connector printed (sink/exactlyonce/hangrunbook.go), once
// however often it was logged, and refuses one that leaves the outcome to
// the operator.
func TestParseRunbook(t *testing.T) {
	const (
		abort = `level=ERROR msg="kafka: the transactional producer cannot commit again" err="hanging transaction: a Kafka transaction of this source ` +
			`…; no marker on outbox-cdc.positions/0 from offset 2, one/0 from offset 5; …; abort it on each partition where it hangs, then restart: … ` +
			`kafka-transactions.sh --bootstrap-server k:9092 find-hanging --topic outbox-cdc.positions --partition 0 --max-transaction-timeout 0 ` +
			`(lists producer id 4, start offset 2), then kafka-transactions.sh --bootstrap-server k:9092 abort --topic outbox-cdc.positions --partition 0 --start-offset 2; ` +
			`kafka-transactions.sh --bootstrap-server k:9092 find-hanging --topic one --partition 0 --max-transaction-timeout 0 (lists producer id 4, start offset 5), ` +
			`then kafka-transactions.sh --bootstrap-server k:9092 abort --topic one --partition 0 --start-offset 5"`
		commit = `exactly_once: hanging transaction: …; it needs a COMMIT marker on each partition where it hangs: COMMIT marker on one/2 ` +
			`(producer id 4, its transaction from offset 9). kafka-transactions.sh writes only aborts (KIP-664), … the WriteTxnMarkers request its abort sends …`
		unknown = `hanging transaction: …; its outcome could not be learned here (the coordinator moved on) and its marker on one/1 decides it: …`
	)
	for _, tc := range []struct {
		name, log, want string
	}{
		{"aborts", "start\n" + abort + "\n" + abort, "[aborted outbox-cdc.positions/0@2 aborted one/0@5]"},
		{"a commit marker", abort + "\n" + commit, "[committed one/2@9]"},
		{"left to the operator", unknown, "error"},
		{"no runbook", "connector exited", "error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			steps, err := parseRunbook(tc.log)
			got := fmt.Sprint(steps)
			if err != nil {
				got = "error"
			}
			if got != tc.want {
				t.Fatalf("parseRunbook = %s (%v), want %s", got, err, tc.want)
			}
		})
	}
}
