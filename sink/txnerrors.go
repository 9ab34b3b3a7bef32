package sink

import (
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
)

// errBegin: the client cannot begin a transaction (its producer id failed
// for good); only a new client, after a restart, can.
var errBegin = errors.New("begin transaction")

// errRefused: the broker refused a record; the transaction is aborted and
// done again with it sent alone or dead-lettered.
var errRefused = errors.New("kafka refused a record of the transaction")

// isFatalTxn: the transactional id was taken over (or is not ours to use);
// nothing this instance does can commit again.
func isFatalTxn(err error) bool {
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

func fatalTxnError(id string, err error) error {
	if errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch) {
		return &FencedError{TransactionalID: id, Err: err}
	}
	return fmt.Errorf("transactional id %s: %w", id, err)
}
