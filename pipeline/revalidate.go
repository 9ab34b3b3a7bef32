package pipeline

import (
	"context"
	"errors"
	"fmt"

	"github.com/outbox-cdc/outbox-cdc/contracts"
	"github.com/outbox-cdc/outbox-cdc/router"
)

// A redrive (sink/quarantine) re-checks event contracts: the dead letter of
// a violation, or of a type without a subject, keeps the event's payload and
// the topic it was meant for, and once an operator registers a schema
// version it fits, a redrive republishes it in the form contracts.mode gives
// (validate: the payload; encode: framed with the latest version's id),
// followed by the parked records, checked too. A record that still does not
// fit refuses the redrive with the reason: nothing is republished and the
// quarantine stays. The checks ask the registry for the subject's latest
// version (contracts.Contracts.ApplyLatest), not the cached one.

// latestApplier is contracts.Contracts.ApplyLatest; an applier without it
// (a test's) is asked with Apply.
type latestApplier interface {
	ApplyLatest(ctx context.Context, topic, eventType string, payload []byte) (contracts.Result, error)
}

// contractRedrive is the quarantine's Revalidator (sink.Config.Contracts).
type contractRedrive struct {
	cfg    Contracts
	format string // kafka.format: router.FormatPlain or a cloudevents one
}

// revalidator is c's Revalidator, nil when contracts are off.
func revalidator(c *Contracts, format string) *contractRedrive {
	if c == nil || c.Apply == nil {
		return nil
	}
	return &contractRedrive{cfg: *c, format: format}
}

// recheck is what a redrive does with one record's value.
type recheck int

const (
	recheckApply  recheck = iota // checked against the latest version
	recheckKeep                  // republished as it is
	recheckRefuse                // the redrive is refused (errNotPlain)
)

// errNotPlain: a contract dead letter keeps the event's payload and plain
// headers, not the CloudEvent the connector would have made of it.
var errNotPlain = errors.New("its dead letter holds the payload, not the CloudEvent kafka.format makes of it, " +
	"so a redrive cannot republish it: publish it yourself, then redrive with --skip")

// recheckOf decides, from kafka.format, contracts.mode, and whether value
// is what the connector published (a parked record, a dead letter the
// broker refused) or a contract dead letter's payload. A published value
// framed in encode mode is kept: it was checked and framed when it was
// let through, and its Avro or Protobuf body cannot be read back as the
// JSON the latest version checks; nor can a CloudEvents structured
// envelope's.
func recheckOf(format string, encode, published bool, value []byte) recheck {
	plain := format == "" || format == router.FormatPlain
	switch {
	case !published && !plain:
		return recheckRefuse
	case published && format == router.FormatCEStructured:
		return recheckKeep
	case published && encode && framed(value):
		return recheckKeep
	}
	return recheckApply
}

func framed(v []byte) bool {
	_, _, err := contracts.ParseHeader(v)
	return err == nil
}

// Revalidate implements quarantine.Revalidator.
func (c *contractRedrive) Revalidate(ctx context.Context, topic, eventType string, value []byte, published bool) ([]byte, error) {
	switch recheckOf(c.format, c.cfg.Encode, published, value) {
	case recheckKeep:
		return value, nil
	case recheckRefuse:
		return nil, errNotPlain
	}
	var res contracts.Result
	var err error
	if l, ok := c.cfg.Apply.(latestApplier); ok {
		res, err = l.ApplyLatest(ctx, topic, eventType, value)
	} else {
		res, err = c.cfg.Apply.Apply(ctx, topic, eventType, value)
	}
	return redriven(value, res, err, &c.cfg)
}

// redriven is the value a redrive republishes, from value and Apply's
// answer for it, or why the redrive is refused.
func redriven(value []byte, res contracts.Result, err error, c *Contracts) ([]byte, error) {
	var v *contracts.Violation
	switch verdict := decideContract(err, c); {
	case verdict == contractPublish && c.Encode:
		return res.Value, nil
	case verdict == contractPublish, verdict == contractUnchecked:
		return value, nil
	case errors.As(err, &v):
		return nil, fmt.Errorf("still violates its contract: %w; register a version it fits and redrive again", err)
	case errors.Is(err, contracts.ErrNoSubject):
		return nil, fmt.Errorf("still has no contract: %w; register its subject and redrive again", err)
	case verdict == contractWait:
		return nil, fmt.Errorf("cannot be checked now: %w; redrive again once the schema registry answers", err)
	}
	return nil, err
}
