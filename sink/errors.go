package sink

import (
	"context"
	"errors"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Class is what to do about a produce error.
type Class int

const (
	// ClassFatal: stop the pipeline; the record is re-delivered after restart.
	ClassFatal Class = iota
	// ClassUnpublishable: the broker refused the record (or the batch it was
	// in); the sink finds out whether it is refused on its own and then
	// dead-letters it.
	ClassUnpublishable
	// ClassShutdown: the client is closing; not an error of the record.
	ClassShutdown
)

// Classify decides, once, what a produce error means. Retriable broker
// errors never reach it: the client retries those without limit.
func Classify(err error) Class {
	switch {
	case errors.Is(err, kgo.ErrClientClosed), errors.Is(err, kgo.ErrAborting),
		errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return ClassShutdown
	case errors.Is(err, kerr.MessageTooLarge), errors.Is(err, kerr.RecordListTooLarge),
		errors.Is(err, kerr.InvalidTopicException), errors.Is(err, kerr.UnknownTopicOrPartition),
		errors.Is(err, kerr.UnknownTopicID), errors.Is(err, kerr.InvalidRecord),
		errors.Is(err, kerr.CorruptMessage), errors.Is(err, kerr.PolicyViolation),
		errors.Is(err, kerr.InvalidTimestamp):
		return ClassUnpublishable
	}
	return ClassFatal
}

// topicWide reports a refusal that concerns the topic, not the record:
// sending the record alone again would only be refused again.
func topicWide(err error) bool { return errors.Is(err, kerr.InvalidTopicException) }

// unknownTopic reports a refusal that means the topic does not exist (yet).
func unknownTopic(err error) bool {
	return errors.Is(err, kerr.UnknownTopicOrPartition) || errors.Is(err, kerr.UnknownTopicID)
}
