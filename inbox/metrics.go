package inbox

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Metric names, each labelled consumer (Config.Consumer).
const (
	MetricProcessed  = "outbox_inbox_processed_total"
	MetricDuplicates = "outbox_inbox_duplicates_total"
	MetricFailed     = "outbox_inbox_failed_total"
	MetricHandler    = "outbox_inbox_handler_seconds"
	MetricDead       = "outbox_inbox_dead_total"
	MetricProcessing = "outbox_inbox_processing_seconds"
	// MetricVersionSkipped counts the events ApplyVersion skipped, labelled
	// reason too (SkipOlder, SkipApplied).
	MetricVersionSkipped = "outbox_inbox_version_skipped_total"
)

type metricVecs struct {
	processed, duplicates, failed, dead, versionSkipped *prometheus.CounterVec
	handler, processing                                 *prometheus.HistogramVec
}

type consumerMetrics struct {
	processed, duplicates, failed, dead prometheus.Counter
	skippedOlder, skippedApplied        prometheus.Counter
	handler, processing                 prometheus.Observer
}

func newVecs() metricVecs {
	label := []string{"consumer"}
	return metricVecs{
		processed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricProcessed,
			Help: "Events handled and committed for the first time."}, label),
		duplicates: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricDuplicates,
			Help: "Records skipped because their event id was already in the inbox (redeliveries)."}, label),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricFailed,
			Help: "Failed attempts (handler error or panic, handler timeout, database error); each is rolled back and retried."}, label),
		dead: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricDead,
			Help: "Records parked in the dead-letter table (inbox.Poison, Config.MaxAttempts)."}, label),
		versionSkipped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricVersionSkipped,
			Help: "Events Consumer.ApplyVersion told the handler to skip: older than the aggregate's applied version, or applied already at it."},
			[]string{"consumer", "reason"}),
		handler: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: MetricHandler,
			Help:    "Time spent in the handler per attempt.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}}, label),
		processing: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: MetricProcessing,
			Help:    "Time per delivery attempt including the transaction's begin, the inbox insert and the commit.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}}, label),
	}
}

// registerMetrics registers the vectors on reg, reusing the ones another
// Consumer already registered there.
func registerMetrics(reg prometheus.Registerer) (metricVecs, error) {
	v := newVecs()
	if reg == nil {
		return v, nil
	}
	var err error
	if v.processed, err = register(reg, v.processed); err != nil {
		return v, err
	}
	if v.duplicates, err = register(reg, v.duplicates); err != nil {
		return v, err
	}
	if v.failed, err = register(reg, v.failed); err != nil {
		return v, err
	}
	if v.dead, err = register(reg, v.dead); err != nil {
		return v, err
	}
	if v.versionSkipped, err = register(reg, v.versionSkipped); err != nil {
		return v, err
	}
	if v.handler, err = register(reg, v.handler); err != nil {
		return v, err
	}
	v.processing, err = register(reg, v.processing)
	return v, err
}

func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing, nil
			}
		}
		return c, err
	}
	return c, nil
}

// with returns the consumer's series, created at once so they are exported
// (as 0) before the first event.
func (v metricVecs) with(consumer string) consumerMetrics {
	return consumerMetrics{
		processed:  v.processed.WithLabelValues(consumer),
		duplicates: v.duplicates.WithLabelValues(consumer),
		failed:     v.failed.WithLabelValues(consumer),
		dead:       v.dead.WithLabelValues(consumer),
		// Both reasons, so that a skip shows as a rise from 0.
		skippedOlder:   v.versionSkipped.WithLabelValues(consumer, SkipOlder),
		skippedApplied: v.versionSkipped.WithLabelValues(consumer, SkipApplied),
		handler:        v.handler.WithLabelValues(consumer),
		processing:     v.processing.WithLabelValues(consumer),
	}
}
