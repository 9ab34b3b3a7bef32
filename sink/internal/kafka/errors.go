package kafka

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The Kafka boundary's error classes, in one place (as franz-go keeps its
// errors.go): what a produce error means, which transactional errors are
// fatal or retriable, and the fencing error of the transactional producer
// (sink/exactlyonce).

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

// TopicWide reports a refusal that concerns the topic, not the record:
// sending the record alone again would only be refused again.
func TopicWide(err error) bool { return errors.Is(err, kerr.InvalidTopicException) }

// UnknownTopic reports a refusal that means the topic does not exist (yet).
func UnknownTopic(err error) bool {
	return errors.Is(err, kerr.UnknownTopicOrPartition) || errors.Is(err, kerr.UnknownTopicID)
}

// ShutdownError keeps a client-closing or context error as it is (it
// classifies as shutdown) and marks anything else as cut short by one.
func ShutdownError(err error) error {
	if Classify(err) == ClassShutdown {
		return err
	}
	return fmt.Errorf("%w (after: %v)", kgo.ErrClientClosed, err)
}

// IsRetriableTxn: a transactional request may be sent again (the
// coordinator is loading or moving, another transaction of the id is still
// ending).
func IsRetriableTxn(err error) bool {
	var ke *kerr.Error
	return errors.As(err, &ke) && ke.Retriable || errors.Is(err, kerr.ConcurrentTransactions)
}

// IsFatalTxn: the transactional id was taken over (or is not ours to use);
// nothing this instance does can commit again.
func IsFatalTxn(err error) bool {
	return errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch) ||
		errors.Is(err, kerr.TransactionalIDAuthorizationFailed) || errors.Is(err, kerr.ClusterAuthorizationFailed)
}

// FencedError is a transactional producer another instance took over.
type FencedError struct {
	TransactionalID string
	Err             error
}

func (e *FencedError) Error() string {
	return fmt.Sprintf("fenced: another outbox-cdc instance with transactional id %s took over this source "+
		"(a standby took over, or a second connector runs on the same slot); this instance stops and commits nothing more: %v",
		e.TransactionalID, e.Err)
}
func (e *FencedError) Unwrap() error { return e.Err }

// FatalTxnError is the error a fatal transactional error (IsFatalTxn)
// stops the connector with: a *FencedError when another instance took the
// id over.
func FatalTxnError(id string, err error) error {
	if errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch) {
		return &FencedError{TransactionalID: id, Err: err}
	}
	return fmt.Errorf("transactional id %s: %w", id, err)
}
