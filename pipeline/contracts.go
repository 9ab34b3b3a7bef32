package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outbox-cdc/outbox-cdc/contracts"
	"github.com/outbox-cdc/outbox-cdc/decode"
	"github.com/outbox-cdc/outbox-cdc/internal/backoff"
	"github.com/outbox-cdc/outbox-cdc/internal/fault"
	"github.com/outbox-cdc/outbox-cdc/internal/metrics"
	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
	"github.com/outbox-cdc/outbox-cdc/router"
)

// Event contracts (contracts.*): every event the processor publishes (from
// the stream, the snapshot or the gap repair) is checked against the schema
// registered under its subject, after routing and before the record is
// handed to the producer. The key is never touched. What happens to it is
// decided in one place, decideContract, from Apply's answer and the
// configured actions:
//   - it fits: published (its value framed in encode mode);
//   - a violation, or a type without a subject: dead-lettered through the
//     router (dlq.mode quarantine then parks the aggregate's later events in
//     order, in both delivery modes), published unchecked (unknown_type
//     pass), or the processor stops with a fatal error (fail);
//   - the registry cannot answer for a subject not cached: the processor
//     waits at the event with backoff, in WAL order, so nothing after it is
//     published and the confirmed position does not pass it; the wait is
//     visible (ContractsWaiting, /readyz, outbox_cdc_contracts_waiting, one
//     log line per wait) and ends when the subject resolves or the run stops.

// Contracts applies event contracts; nil in Config: off.
type Contracts struct {
	// Apply checks (and in encode mode frames) a payload: *contracts.Contracts.
	Apply ContractApplier
	// Encode: the record value becomes Apply's framed value (contracts.mode
	// encode); otherwise the value stays as routed.
	Encode bool
	// OnViolation is ContractDeadLetter or ContractFail
	// (contracts.on_violation quarantine and dlq, fail).
	OnViolation ContractAction
	// UnknownType is ContractDeadLetter, ContractPass or ContractFail
	// (contracts.unknown_type quarantine, pass, fail).
	UnknownType ContractAction
	// RegistryURL, when set, makes a checked CloudEvent (kafka.format
	// cloudevents-*) name its schema: dataschema is
	// contracts.SchemaURL(RegistryURL, id), and in binary mode
	// datacontenttype is MediaType (contracts.MediaType).
	RegistryURL, MediaType string
}

// ContractApplier is contracts.Contracts as the pipeline uses it.
type ContractApplier interface {
	Apply(ctx context.Context, topic, eventType string, payload []byte) (contracts.Result, error)
}

// ContractAction is what a violation or an unknown type does to its event.
type ContractAction int

// Actions.
const (
	// ContractDeadLetter dead-letters the event as the router does a row it
	// rejects: with dlq.mode quarantine its aggregate's later events are
	// parked (quarantine), with skip it is the only record dead-lettered (dlq).
	ContractDeadLetter ContractAction = iota
	// ContractPass publishes the event unchecked (unknown_type only).
	ContractPass
	// ContractFail stops the connector before the event: nothing from it on
	// is confirmed.
	ContractFail
)

// contractVerdict is what happens to one event.
type contractVerdict int

const (
	contractPublish    contractVerdict = iota // it fits: published
	contractUnchecked                         // published as routed, not checked
	contractDeadLetter                        // dead-lettered with the contract's headers
	contractFail                              // the processor stops with a fatal error
	contractWait                              // the registry cannot tell yet: wait and ask again
	contractStop                              // not a contract answer (the context ended): returned as is
)

// decideContract is the one place an Apply answer becomes a verdict.
// ErrBadSchema and ErrIncompatible (the registered schema does not compile
// here, the local one is refused) wait like an unreachable registry: the
// event can be judged only once an operator fixes the registry, and
// waiting neither drops nor skips it.
func decideContract(err error, c *Contracts) contractVerdict {
	var v *contracts.Violation
	switch {
	case err == nil:
		return contractPublish
	case errors.As(err, &v):
		return verdictOf(c.OnViolation)
	case errors.Is(err, contracts.ErrNoSubject):
		return verdictOf(c.UnknownType)
	case contracts.Retryable(err), errors.Is(err, contracts.ErrBadSchema), errors.Is(err, contracts.ErrIncompatible):
		return contractWait
	}
	return contractStop
}

func verdictOf(a ContractAction) contractVerdict {
	switch a {
	case ContractDeadLetter:
		return contractDeadLetter
	case ContractPass:
		return contractUnchecked
	}
	return contractFail
}

// contractGate is the processor's side of the contracts. The processor
// alone calls check; waitingFor may be read from any goroutine.
type contractGate struct {
	cfg   Contracts
	log   *slog.Logger
	gauge prometheus.Gauge // outbox_cdc_contracts_waiting: written here only
	// m counts violations and unknown types (outbox_cdc_contract_violations_total):
	// written here only.
	m *metrics.Contracts
	// waiting is the subject the processor waits for; nil when none.
	waiting     atomic.Pointer[string]
	first, most time.Duration // the wait's backoff
}

// newContractGate returns nil when contracts are off.
func newContractGate(cfg *Contracts, m *metrics.Metrics, log *slog.Logger) *contractGate {
	if cfg == nil || cfg.Apply == nil {
		return nil
	}
	// The client's registry series (request time, errors, cache misses)
	// are written by the client itself, through the observer.
	if o, ok := cfg.Apply.(interface{ SetObserver(contracts.Observer) }); ok {
		o.SetObserver(m.ContractsObserver())
	}
	return &contractGate{cfg: *cfg, log: log, gauge: m.ContractsWaiting, m: &m.Contracts,
		first: 200 * time.Millisecond, most: 10 * time.Second}
}

// ContractsWaiting is the subject whose event the processor waits at for
// the schema registry, "" when it waits for none (/readyz).
func (p *Pipeline) ContractsWaiting() string { return p.proc.contracts.waitingFor() }

func (g *contractGate) waitingFor() string {
	if g == nil {
		return ""
	}
	if s := g.waiting.Load(); s != nil {
		return *s
	}
	return ""
}

// contractCtx is the context a wait for the registry ends with: the
// processor's (a stop), or ctx before streaming starts (the snapshot).
func (w *processor) contractCtx(ctx context.Context) context.Context {
	if w.ctx != nil {
		return w.ctx
	}
	return ctx
}

// check applies the contract to rec, just routed from ev by r. It leaves
// rec published (its value framed in encode mode) or dead-lettered (the
// reason returned), or returns what stops the processor: ctx's end while
// it waits, or a fatal error (fail). A tombstone has no payload to check.
func (g *contractGate) check(ctx context.Context, r *router.Router, ev *decode.Event, commit time.Time, rec *router.Record) (string, error) {
	if g == nil || ev.Payload.Null {
		return "", nil
	}
	eventType := ""
	if !ev.EventType.Null {
		eventType = string(ev.EventType.Bytes)
	}
	payload := ev.Payload.Bytes
	if payload == nil {
		payload = []byte{}
	}
	res, err := g.resolve(ctx, rec.Topic, eventType, payload)
	g.count(eventType, err)
	switch decideContract(err, &g.cfg) {
	case contractPublish:
		if g.cfg.Encode {
			rec.Value = res.Value
		}
		g.schemaAttributes(r.Format(), rec, res.Schema)
		return "", nil
	case contractUnchecked:
		return "", nil
	case contractDeadLetter:
		reason, topic := err.Error(), rec.Topic
		r.DeadLetter(ev, commit, reason, rec)
		rec.Headers = slices.Insert(rec.Headers, 1, contractHeaders(err, topic)...) // after error
		return reason, nil
	case contractFail:
		return "", contractFailure(err, ev)
	}
	return "", err
}

// count counts a violation or an unknown type, whatever happens to it.
func (g *contractGate) count(eventType string, err error) {
	var v *contracts.Violation
	switch {
	case err == nil:
	case errors.As(err, &v):
		g.m.Violation(eventType, metrics.ViolationReason)
	case errors.Is(err, contracts.ErrNoSubject):
		g.m.Violation(eventType, metrics.UnknownTypeReason)
	}
}

// schemaAttributes makes a CloudEvent checked against ref say so
// (CloudEvents 1.0.2 "dataschema", "datacontenttype"). In binary mode the
// ce_dataschema header is added and content-type becomes the contract's
// media type (in validate mode a JSON type the router set, such as a
// configured application/vnd.x+json, stays). In structured mode (validate
// only: config refuses encode there) dataschema goes first in the JSON
// envelope, whose data and datacontenttype the router set from the payload.
func (g *contractGate) schemaAttributes(format string, rec *router.Record, ref contracts.SchemaRef) {
	if g.cfg.RegistryURL == "" || rec.Value == nil || format == router.FormatPlain {
		return
	}
	url := contracts.SchemaURL(g.cfg.RegistryURL, ref.ID)
	if format == router.FormatCEStructured {
		if len(rec.Value) > 0 && rec.Value[0] == '{' {
			q, _ := json.Marshal(url) // a string always marshals
			v := make([]byte, 0, len(rec.Value)+len(q)+16)
			v = append(append(v, `{"dataschema":`...), q...)
			rec.Value = append(append(v, ','), rec.Value[1:]...)
		}
		return
	}
	rec.Headers = append(rec.Headers, router.Header{Key: wire.CEHeaderPrefix + "dataschema", Value: []byte(url)})
	for i, h := range rec.Headers {
		if h.Key == wire.HeaderContentType && (g.cfg.Encode || !wire.JSONContentType(string(h.Value))) {
			rec.Headers[i].Value = []byte(g.cfg.MediaType)
		}
	}
}

// resolve calls Apply until the registry answers for the event's subject,
// waiting with backoff; it returns ctx's error when ctx ends first.
func (g *contractGate) resolve(ctx context.Context, topic, eventType string, payload []byte) (contracts.Result, error) {
	var since time.Time
	for n := 0; ; n++ {
		res, err := g.cfg.Apply.Apply(ctx, topic, eventType, payload)
		if cerr := ctx.Err(); cerr != nil {
			g.endWait(since)
			return res, cerr
		}
		if decideContract(err, &g.cfg) != contractWait {
			g.endWait(since)
			return res, err
		}
		if n == 0 {
			since = time.Now()
			g.beginWait(err)
		}
		backoff.Sleep(ctx, backoff.Jitter(backoff.Nth(g.first, g.most, n)))
	}
}

// beginWait makes the wait visible: once per wait, naming the subject.
func (g *contractGate) beginWait(err error) {
	subject := "(none)" // not "": waitingFor says "not waiting" with it
	var re *contracts.RegistryError
	if errors.As(err, &re) && re.Subject != "" {
		subject = re.Subject
	}
	g.waiting.Store(&subject)
	g.gauge.Set(1)
	msg := "an event waits for the schema registry: nothing after it is published or confirmed until its subject resolves"
	if contracts.Retryable(err) {
		g.log.Warn(msg, "subject", subject, "err", err)
		return
	}
	g.log.Error(msg+"; fix the schema in the registry", "subject", subject, "err", err)
}

func (g *contractGate) endWait(since time.Time) {
	if since.IsZero() {
		return
	}
	subject := g.waitingFor()
	g.waiting.Store(nil)
	g.gauge.Set(0)
	g.log.Info("the schema registry answered: events flow again", "subject", subject,
		"waited", time.Since(since).Round(time.Millisecond))
}

// contractHeaders are the headers a contract dead letter carries after
// error: the topic the event was meant for (wire.HeaderTopic, as a record
// the broker refused has it: a redrive republishes it there), the subject
// and the version of its contract (wire.HeaderContractSubject,
// wire.HeaderContractVersion). An event without a subject (no event type)
// gets none: no schema can ever be registered for it, and a redrive refuses
// it as the router's dead letters.
func contractHeaders(err error, topic string) []router.Header {
	var v *contracts.Violation
	var re *contracts.RegistryError
	switch {
	case errors.As(err, &v):
		return []router.Header{{Key: wire.HeaderTopic, Value: []byte(topic)},
			{Key: wire.HeaderContractSubject, Value: []byte(v.Schema.Subject)},
			{Key: wire.HeaderContractVersion, Value: []byte(strconv.Itoa(v.Schema.Version))}}
	case errors.As(err, &re) && re.Subject != "":
		return []router.Header{{Key: wire.HeaderTopic, Value: []byte(topic)},
			{Key: wire.HeaderContractSubject, Value: []byte(re.Subject)}}
	}
	return nil
}

// contractFailure is the fatal error of contracts' fail: it names the
// event, and err names the subject, the version and the reason.
func contractFailure(err error, ev *decode.Event) error {
	key := "contracts.unknown_type"
	var v *contracts.Violation
	if errors.As(err, &v) {
		key = "contracts.on_violation"
	}
	return &fault.FatalError{Reason: "contract", Err: fmt.Errorf(
		"%s is fail: event %s (aggregate_id %s) stops the connector, and nothing from it on is confirmed: %w; "+
			"register a schema version it fits (or set %s: quarantine) and start again: it is published then",
		key, ev.ID.Bytes, ev.AggregateID.Bytes, err, key)}
}
