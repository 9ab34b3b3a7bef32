package sink

import (
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
)

// The repair's order guarantee reads franz-go's log, because no hook runs
// at the right moment: OnProduceRecordUnbuffered runs on the promise
// goroutine, after the partition's lock is released, when a record
// produced after the failure may already be in a batch. franz-go logs a
// batch it fails for good on the goroutine handling the response, holding
// the partition's buffer lock, before it fails every record buffered for
// the partition. Holding the topic back right there, rather than when the
// outcomes arrive (possibly much later, after other promises), means a
// record produced after the failure cannot be sent before the failed ones
// are sent again: it is held, or it is on its way into the client with the
// cancelled Context and fails unsent.
//
// All of the matching is in this file. clientlog_test.go makes the pinned
// franz-go emit each line below against kfake and checks that the matcher
// sees it: an upgrade that rewords one fails that test, not the order.
const (
	// kgo sink.go handleReqRespBatch: the broker refused a batch; every
	// record buffered for the partition fails with its error.
	logBatchFailed = "batch in a produce request failed"
	// kgo sink.go bumpRepeatedLoadErr: a partition's metadata keeps
	// failing; will_fail says whether its records fail now.
	logLoadError = "produce partition load error"
	// kgo producer.go waitUnknownTopic: a new topic's metadata never
	// came; its buffered records fail.
	logUnknownFailed = "failing all records"
)

// clientLog is franz-go's logger, used as a hook and logging nothing.
type clientLog struct{ hold func(topic string) }

func (clientLog) Level() kgo.LogLevel { return kgo.LogLevelInfo }

func (l clientLog) Log(_ kgo.LogLevel, msg string, keyvals ...any) {
	if topic, ok := failsForGood(msg, keyvals...); ok {
		l.hold(topic)
	}
}

// failsForGood reports the topic of a franz-go log line that says the
// client fails a partition's or a topic's records for good for a reason
// the sink repairs (ClassUnpublishable).
func failsForGood(msg string, keyvals ...any) (string, bool) {
	var (
		topic    string
		err      error
		willFail bool
	)
	for i := 0; i+1 < len(keyvals); i += 2 {
		switch keyvals[i] {
		case "topic":
			topic, _ = keyvals[i+1].(string)
		case "err":
			err, _ = keyvals[i+1].(error)
		case "will_fail":
			willFail, _ = keyvals[i+1].(bool)
		}
	}
	var failing bool
	switch {
	case strings.HasPrefix(msg, logBatchFailed):
		failing = true
	case strings.HasPrefix(msg, logLoadError):
		failing = willFail
	case strings.Contains(msg, logUnknownFailed):
		failing = true
	}
	return topic, failing && topic != "" && err != nil && Classify(err) == ClassUnpublishable
}
