package main

import (
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv/cdctest"
)

func TestEventID(t *testing.T) {
	for _, seq := range []int{0, 1, 255, 999_999, 1 << 40} {
		id := eventID(seq)
		if len(id) != 36 {
			t.Fatalf("eventID(%d) = %q: not a UUID", seq, id)
		}
		got, ok := seqOf([]byte(id))
		if !ok || got != seq {
			t.Fatalf("seqOf(%q) = %d, %v; want %d", id, got, ok, seq)
		}
	}
	for _, bad := range []string{"", "0b8e2a52-3c1f-4f0e-9d59-5b7f3f0f6a11", idPrefix + "zzzzzzzzzzzz", idPrefix + "1"} {
		if _, ok := seqOf([]byte(bad)); ok {
			t.Fatalf("seqOf(%q) accepted", bad)
		}
	}
}

const metricsPage = `# HELP outbox_cdc_events_published_total Outbox events acknowledged.
# TYPE outbox_cdc_events_published_total counter
outbox_cdc_events_published_total 1000
outbox_cdc_events_dead_lettered_total 2
outbox_cdc_commit_to_ack_seconds_bucket{le="0.001"} 10
outbox_cdc_commit_to_ack_seconds_bucket{le="0.002"} 900
outbox_cdc_commit_to_ack_seconds_bucket{le="0.005"} 995
outbox_cdc_commit_to_ack_seconds_bucket{le="0.01"} 1000
outbox_cdc_commit_to_ack_seconds_bucket{le="+Inf"} 1000
outbox_cdc_commit_to_ack_seconds_sum 1.5
outbox_cdc_commit_to_ack_seconds_count 1000
go_gc_duration_seconds{quantile="0.5"} 0.0001
`

func TestParseProm(t *testing.T) {
	s := mustParse(t, metricsPage)
	if got := delivered(s); got != 1002 {
		t.Fatalf("delivered = %d, want 1002", got)
	}
	q := quantiles(commitToAck(s))
	if q == nil || q.Count != 1000 {
		t.Fatalf("quantiles = %+v", q)
	}
	if q.P50UpperMs != 2 || q.P99UpperMs != 5 || q.P999UpperMs != 10 || q.MaxUpperMs != 10 {
		t.Fatalf("upper bounds p50 %v p99 %v p99.9 %v max %v", q.P50UpperMs, q.P99UpperMs, q.P999UpperMs, q.MaxUpperMs)
	}
	// 500th of 1000 lies 490/890 into the 1-2 ms bucket.
	if want := 1 + 490.0/890; math.Abs(q.P50EstimateMs-want) > 1e-9 {
		t.Fatalf("p50 estimate %v, want %v", q.P50EstimateMs, want)
	}
	before := mustParse(t, `outbox_cdc_commit_to_ack_seconds_bucket{le="0.001"} 10
outbox_cdc_commit_to_ack_seconds_bucket{le="0.002"} 10
outbox_cdc_commit_to_ack_seconds_bucket{le="0.005"} 10
outbox_cdc_commit_to_ack_seconds_bucket{le="0.01"} 10
outbox_cdc_commit_to_ack_seconds_bucket{le="+Inf"} 10
outbox_cdc_commit_to_ack_seconds_count 10
`)
	d := quantiles(commitToAck(s).Minus(commitToAck(before)))
	if d.Count != 990 || d.P50UpperMs != 2 || d.Buckets[0].Count != 0 {
		t.Fatalf("difference %+v", d)
	}
}

func TestParseMicro(t *testing.T) {
	out := `goos: linux
goarch: amd64
pkg: github.com/outbox-cdc/outbox-cdc/decode
cpu: AMD EPYC
BenchmarkDecodeInsert-2        	 4623746	       259.2 ns/op	1312.27 MB/s	       0 B/op	       0 allocs/op
BenchmarkDecodeBeginCommit-2   	20000000	        60.1 ns/op	       0 B/op	       0 allocs/op
PASS
ok  	github.com/outbox-cdc/outbox-cdc/decode	3.1s
pkg: github.com/outbox-cdc/outbox-cdc/router
BenchmarkRouteDeadLetter-2     	 1000000	      1020 ns/op	     448 B/op	       7 allocs/op
`
	res, err := parseMicro(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 3 {
		t.Fatalf("%d results", len(res))
	}
	if r := res[0]; shortPkg(r.Package) != "decode" || benchName(r.Name) != "BenchmarkDecodeInsert" ||
		r.NsPerOp != 259.2 || r.MBPerSec != 1312.27 || r.AllocsPerOp != 0 || r.Iterations != 4623746 {
		t.Fatalf("first result %+v", r)
	}
	if r := res[2]; shortPkg(r.Package) != "router" || r.AllocsPerOp != 7 || r.BytesPerOp != 448 {
		t.Fatalf("last result %+v", r)
	}
	if _, err := parseMicro("--- FAIL: BenchmarkX\nFAIL\n"); err == nil {
		t.Fatal("a failed benchmark run was accepted")
	}
}

func TestParseProcStat(t *testing.T) {
	line := []byte("4242 (postgres: wal (sender)) S 1 4242 4242 0 -1 4194560 100 0 0 0 37 12 5 3 20 0 1 0 123 0 0")
	p, err := parseProcStat(line)
	if err != nil {
		t.Fatal(err)
	}
	if p.ppid != 1 || p.own != 49 || p.kids != 8 || p.zombie {
		t.Fatalf("%+v", p)
	}
	z, err := parseProcStat([]byte("77 (postgres) Z 42 77 77 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 123 0 0"))
	if err != nil || !z.zombie || z.ppid != 42 {
		t.Fatalf("zombie: %+v %v", z, err)
	}
}

func TestPercentiles(t *testing.T) {
	var v []float64
	for i := 1000; i >= 1; i-- {
		v = append(v, float64(i))
	}
	p := percentiles(v)
	if p.N != 1000 || p.P50Ms != 500 || p.P99Ms != 990 || p.P999Ms != 999 || p.MaxMs != 1000 || p.MeanMs != 500.5 {
		t.Fatalf("%+v", p)
	}
	if v[0] != 1000 {
		t.Fatal("percentiles sorted its input")
	}
}

func TestThousands(t *testing.T) {
	for n, want := range map[int]string{0: "0", 999: "999", 1000: "1,000", 1234567: "1,234,567", -5000: "-5,000"} {
		if got := thousands(n); got != want {
			t.Fatalf("thousands(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestReportAndChart(t *testing.T) {
	r := &Results{Params: Params{Rates: []int{500, 2000, 10000}, Duration: "20s"}, Env: EnvInfo{Cores: 2}}
	for i, rate := range r.Params.Rates {
		f := float64(i + 1)
		r.Steady = append(r.Steady,
			SteadyResult{System: "outbox-cdc", OfferedRate: rate, AchievedRate: float64(rate), Committed: rate * 20,
				CommitToConsume: Percentiles{N: 10, P50Ms: f, P99Ms: 5 * f, P999Ms: 9 * f, MaxMs: 10 * f},
				CommitToAck:     &HistQuantiles{Count: 10, P50UpperMs: 1, P99UpperMs: 7.5, P999UpperMs: -1},
				CPU:             CPUUsage{WallSeconds: 20, Client: 1}},
			SteadyResult{System: "relay-1s", PollInterval: "1s", OfferedRate: rate, AchievedRate: float64(rate), Committed: rate * 20,
				CommitToConsume: Percentiles{N: 10, P50Ms: 500, P99Ms: 990, P999Ms: 1000, MaxMs: 1010},
				CPU:             CPUUsage{WallSeconds: 20}})
	}
	r.Targets = evaluateTargets(r)
	ack := r.Targets[1]
	if ack.Status != statusMet {
		t.Fatalf("ack target %+v", ack)
	}
	relay := r.Targets[len(r.Targets)-1]
	if relay.Status != statusMet || !strings.Contains(relay.Measured, "500/s: 500 ms vs 1.00 ms = 500×") {
		t.Fatalf("relay target %+v", relay)
	}
	if err := writeChart(filepath.Join(t.TempDir(), "latency.png"), r); err != nil {
		t.Fatal(err)
	}
	md := renderReport(r, "latency.png", nil)
	for _, want := range []string{"## Targets", "## Steady latency", "| 2,000 | outbox-cdc | 2,000 |", "+Inf"} {
		if !strings.Contains(md, want) {
			t.Fatalf("report lacks %q:\n%s", want, md)
		}
	}
}

func mustParse(t *testing.T, page string) cdctest.Metrics {
	t.Helper()
	m, err := cdctest.ParseMetrics([]byte(page))
	if err != nil {
		t.Fatal(err)
	}
	return m
}
