package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Event contracts (contracts.*). The pipeline's contract gate writes
// Violations (pipeline/contracts.go); the contracts client writes the
// registry series through the Observer the gate sets (ContractsObserver),
// so each has one writer.
type Contracts struct {
	// Violations counts events whose payload does not fit their schema
	// (reason violation) or whose type has no subject (unknown_type), by
	// event type: at most MaxEventTypes values, then OtherEventType.
	Violations *prometheus.CounterVec
	// RegistryRequests times each HTTP request to the registry.
	RegistryRequests prometheus.Histogram
	// RegistryErrors counts registry answers that are errors, by kind
	// (contracts.Kinds).
	RegistryErrors *prometheus.CounterVec
	// CacheMisses counts subjects asked of the registry because no version
	// was in memory.
	CacheMisses prometheus.Counter

	mu    sync.Mutex
	types map[string]bool // the event_type label values given so far
}

// The violation reasons: a fixed set.
const (
	ViolationReason   = "violation"
	UnknownTypeReason = "unknown_type"
)

// MaxEventTypes bounds the event_type label of Violations: event types are
// the applications' data, and a bug writing random types must not make a
// series per row. The first MaxEventTypes types seen keep their name for
// the life of the process; later ones are counted as OtherEventType.
const MaxEventTypes = 100

// OtherEventType is the event_type label of the types past MaxEventTypes.
const OtherEventType = "other"

// registryKinds are contracts.Kinds(), created at zero so that a rate over
// them exists before the first error (kept here so that metrics imports no
// connector package; TestContractsMetrics compares the two).
var registryKinds = []string{"unreachable", "no_subject", "incompatible", "bad_schema"}

func (m *Metrics) addContracts(ns string) {
	c := &m.Contracts
	c.Violations = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "contract_violations_total",
		Help: "Events that failed their contract, by event_type (the first 100 types, then \"other\") and reason " +
			"(violation: the payload does not fit the schema; unknown_type: no subject for the type); contracts.on_violation " +
			"and contracts.unknown_type say where they went."}, []string{"event_type", "reason"})
	c.RegistryRequests = prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "registry_request_seconds",
		Help:    "Duration of each HTTP request to the schema registry (contracts.registry.url), answered or not.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}})
	c.RegistryErrors = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "registry_errors_total",
		Help: "Schema registry requests that ended in an error, by kind (unreachable: no answer, 5xx or auth; " +
			"no_subject; incompatible; bad_schema)."}, []string{"kind"})
	c.CacheMisses = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "contract_cache_misses_total",
		Help: "Subjects asked of the schema registry because no version of them was in memory (first event of a type, or a type the registry did not know)."})
	for _, k := range registryKinds {
		c.RegistryErrors.WithLabelValues(k)
	}
	c.types = map[string]bool{}
	m.Registry.MustRegister(c.Violations, c.RegistryRequests, c.RegistryErrors, c.CacheMisses)
}

// Violation counts one event of eventType that failed its contract for
// reason (ViolationReason or UnknownTypeReason).
func (c *Contracts) Violation(eventType, reason string) {
	c.Violations.WithLabelValues(c.eventTypeLabel(eventType), reason).Inc()
}

// eventTypeLabel is eventType while fewer than MaxEventTypes types have a
// label of their own, or it already has one; else OtherEventType.
func (c *Contracts) eventTypeLabel(eventType string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.types[eventType] {
		return eventType
	}
	if len(c.types) >= MaxEventTypes {
		return OtherEventType
	}
	c.types[eventType] = true
	return eventType
}

// ContractsObserver is the contracts client's Observer
// (contracts.Observer) writing the registry series.
type ContractsObserver struct{ c *Contracts }

// ContractsObserver returns the observer the pipeline gives the contracts
// client.
func (m *Metrics) ContractsObserver() ContractsObserver { return ContractsObserver{&m.Contracts} }

// RegistryRequest observes one request's duration.
func (o ContractsObserver) RegistryRequest(d time.Duration) {
	o.c.RegistryRequests.Observe(d.Seconds())
}

// RegistryError counts one error of kind.
func (o ContractsObserver) RegistryError(kind string) { o.c.RegistryErrors.WithLabelValues(kind).Inc() }

// CacheMiss counts one miss.
func (o ContractsObserver) CacheMiss() { o.c.CacheMisses.Inc() }
