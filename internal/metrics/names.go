package metrics

import (
	"fmt"
	"reflect"
	"regexp"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// SeriesNames returns the names a Prometheus query can use for the metrics g
// gathers: each family, plus _bucket, _sum and _count for histograms (_sum and
// _count for summaries). Dashboards and alert rules are checked against it.
func SeriesNames(g prometheus.Gatherer) (map[string]bool, error) {
	mfs, err := g.Gather()
	if err != nil {
		return nil, fmt.Errorf("gather metrics: %w", err)
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		addSeries(names, mf.GetName(), mf.GetType())
	}
	return names, nil
}

// SeriesNames returns every series name the connector exports. A vector has
// no series in Gather until a label value is set, so the names of the
// collectors in m's fields are added from their descriptions.
func (m *Metrics) SeriesNames() (map[string]bool, error) {
	names, err := SeriesNames(m.Registry)
	if err != nil {
		return nil, err
	}
	rv := reflect.ValueOf(m).Elem()
	for i := range rv.NumField() {
		f := rv.Field(i)
		if !f.CanInterface() || (f.Kind() == reflect.Pointer || f.Kind() == reflect.Interface) && f.IsNil() {
			continue
		}
		c, ok := f.Interface().(prometheus.Collector)
		if !ok {
			continue
		}
		typ := dto.MetricType_UNTYPED
		if _, ok := c.(*prometheus.HistogramVec); ok {
			typ = dto.MetricType_HISTOGRAM
		}
		ch := make(chan *prometheus.Desc)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			// Desc exposes its name only through String.
			if n := descName.FindStringSubmatch(d.String()); n != nil {
				addSeries(names, n[1], typ)
			}
		}
	}
	return names, nil
}

var descName = regexp.MustCompile(`fqName: "([^"]+)"`)

func addSeries(names map[string]bool, n string, typ dto.MetricType) {
	names[n] = true
	switch typ {
	case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
		names[n+"_bucket"], names[n+"_sum"], names[n+"_count"] = true, true, true
	case dto.MetricType_SUMMARY:
		names[n+"_sum"], names[n+"_count"] = true, true
	}
}
