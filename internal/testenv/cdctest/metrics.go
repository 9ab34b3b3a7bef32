package cdctest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Metrics is one scrape of a /metrics page in the Prometheus text
// exposition format: every sample, by metric name (a histogram's series are
// NAME_bucket, NAME_sum and NAME_count).
type Metrics struct {
	samples map[string][]metricSample
}

type metricSample struct {
	labels string // the text between the braces, "" when unlabelled
	value  float64
	le     float64 // a histogram bucket's bound (NAME_bucket{le="..."})
}

// Scrape reads http://addr/metrics; anything but a 200 with a well-formed
// page is an error. The request has ctx's deadline, 5 s at most.
func Scrape(ctx context.Context, addr string) (Metrics, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return Metrics{}, fmt.Errorf("metrics: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return Metrics{}, fmt.Errorf("metrics: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return Metrics{}, fmt.Errorf("metrics: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return Metrics{}, fmt.Errorf("metrics: GET %s: %s", req.URL, resp.Status)
	}
	return ParseMetrics(b)
}

// Metric scrapes addr and returns name's value (Metrics.Value).
func Metric(ctx context.Context, addr, name string) (float64, error) {
	m, err := Scrape(ctx, addr)
	if err != nil {
		return 0, err
	}
	return m.Value(name)
}

// ParseMetrics reads the text exposition format: "name value",
// "name{labels} value", either with an optional timestamp; comments and
// blank lines are skipped, any other line is an error, and so is a
// NAME_bucket sample without a numeric le label.
func ParseMetrics(b []byte) (Metrics, error) {
	m := Metrics{samples: map[string][]metricSample{}}
	for i, line := range strings.Split(string(b), "\n") {
		if line = strings.TrimSpace(line); line == "" || line[0] == '#' {
			continue
		}
		name, labels, rest := line, "", ""
		if open := strings.IndexByte(line, '{'); open >= 0 {
			end := strings.LastIndexByte(line, '}')
			if end < open {
				return Metrics{}, fmt.Errorf("metrics line %d %q: unclosed labels", i+1, line)
			}
			name, labels, rest = line[:open], line[open+1:end], line[end+1:]
		} else if sp := strings.IndexAny(line, " \t"); sp >= 0 {
			name, rest = line[:sp], line[sp:]
		}
		fields := strings.Fields(rest)
		if name == "" || len(fields) < 1 || len(fields) > 2 {
			return Metrics{}, fmt.Errorf("metrics line %d %q: want name, labels, value and an optional timestamp", i+1, line)
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return Metrics{}, fmt.Errorf("metrics line %d %q: %w", i+1, line, err)
		}
		s := metricSample{labels: labels, value: v}
		if strings.HasSuffix(name, "_bucket") {
			// "+Inf" parses as +Inf.
			if s.le, err = strconv.ParseFloat(labelValue(labels, "le"), 64); err != nil {
				return Metrics{}, fmt.Errorf("metrics line %d %q: le: %w", i+1, line, err)
			}
		}
		m.samples[name] = append(m.samples[name], s)
	}
	return m, nil
}

// Value is name's value: the sum of its series (the per-table event counters
// carry the table as a label; every table counts). A name with no sample is
// an error.
func (m Metrics) Value(name string) (float64, error) {
	base, want := name, ""
	if i := strings.IndexByte(name, '{'); i >= 0 && strings.HasSuffix(name, "}") {
		base, want = name[:i], name[i+1:len(name)-1] // name{label="v",…}: the series with those labels
	}
	sum, found := 0.0, false
	for _, s := range m.samples[base] {
		if hasLabels(s.labels, want) {
			sum, found = sum+s.value, true
		}
	}
	if !found {
		return 0, fmt.Errorf("metric %s not found", name)
	}
	return sum, nil
}

// hasLabels reports whether the label list has every pair of want (both
// as exposed: name="value", comma-separated).
func hasLabels(labels, want string) bool {
	if want == "" {
		return true
	}
	have := map[string]bool{}
	for _, l := range strings.Split(labels, ",") {
		have[strings.TrimSpace(l)] = true
	}
	for _, w := range strings.Split(want, ",") {
		if !have[strings.TrimSpace(w)] {
			return false
		}
	}
	return true
}

// Sum is Value with 0 for a name with no sample (a counter not yet
// incremented is not exported).
func (m Metrics) Sum(name string) float64 {
	v, _ := m.Value(name)
	return v
}

// Histogram is a cumulative Prometheus histogram.
type Histogram struct {
	Buckets []Bucket // ascending Le, cumulative counts, +Inf last
	Count   float64
	Sum     float64
}

// Bucket is one cumulative bucket: Count observations at most Le.
type Bucket struct {
	Le    float64
	Count float64
}

// Histogram is histogram name, its series summed per bucket bound (what
// PromQL's sum by (le) does); empty when there is none.
func (m Metrics) Histogram(name string) Histogram {
	h := Histogram{Count: m.Sum(name + "_count"), Sum: m.Sum(name + "_sum")}
	byLe := map[float64]float64{}
	for _, s := range m.samples[name+"_bucket"] {
		byLe[s.le] += s.value
	}
	for le, c := range byLe {
		h.Buckets = append(h.Buckets, Bucket{Le: le, Count: c})
	}
	sort.Slice(h.Buckets, func(i, j int) bool { return h.Buckets[i].Le < h.Buckets[j].Le })
	return h
}

// Minus returns h - before: the observations between two scrapes.
func (h Histogram) Minus(before Histogram) Histogram {
	out := Histogram{Count: h.Count - before.Count, Sum: h.Sum - before.Sum}
	for i, b := range h.Buckets {
		c := b.Count
		if i < len(before.Buckets) && before.Buckets[i].Le == b.Le {
			c -= before.Buckets[i].Count
		}
		out.Buckets = append(out.Buckets, Bucket{Le: b.Le, Count: c})
	}
	return out
}

// labelValue is key's value in a label list such as `table="a",le="0.5"`.
func labelValue(labels, key string) string {
	for kv := range strings.SplitSeq(labels, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if ok && strings.TrimSpace(k) == key {
			return strings.Trim(strings.TrimSpace(v), `"`)
		}
	}
	return ""
}
