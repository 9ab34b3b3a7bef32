package verify

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"unsafe"
)

// rec is a record of topic "t" with id and key in partition p; the offset is
// filled in by run.
func rec(p int32, key, id string) Record {
	return Record{Topic: "t", Partition: p, Key: []byte(key), ID: []byte(id), HasID: true}
}

// run feeds rows (ids, in table order, topic "t"), then records, then the
// rows again, and returns the result and the rows Check called missing.
func run(t *testing.T, rows []string, recs []Record) (Result, []string) {
	t.Helper()
	c := New()
	for _, id := range rows {
		c.AddRow(Row{ID: []byte(id), Topic: "t"})
	}
	c.Seal()
	offsets := map[int32]int64{}
	for _, r := range recs {
		r.Offset = offsets[r.Partition]
		offsets[r.Partition]++
		c.AddRecord(r)
	}
	var missing []string
	for _, id := range rows {
		m, ok := c.Check(Row{ID: []byte(id), Topic: "t"})
		if !ok {
			t.Fatalf("Check(%s): not the row of pass 1", id)
		}
		if m {
			missing = append(missing, id)
		}
	}
	return c.Result(), missing
}

func TestCompare(t *testing.T) {
	rows := []string{"a1", "a2", "b1", "a3", "b2"} // aggregates a and b, table order
	all := []Record{rec(0, "a", "a1"), rec(1, "b", "b1"), rec(0, "a", "a2"), rec(0, "a", "a3"), rec(1, "b", "b2")}
	tests := []struct {
		name       string
		rows       []string
		recs       []Record
		missing    []string
		dup, order []string
		found      int64
		outside    int64
		withoutID  int64
		deadLetter int64
	}{
		{name: "all there", rows: rows, recs: all, found: 5},
		{name: "no rows", recs: all, outside: 5},
		{name: "no records", rows: rows, missing: rows},
		{name: "two missing", rows: rows,
			recs:    []Record{rec(0, "a", "a1"), rec(0, "a", "a3"), rec(1, "b", "b2")},
			missing: []string{"a2", "b1"}, found: 3},
		{name: "a duplicate run after a restart is not out of order", rows: rows,
			recs: append(append([]Record{}, all...), rec(0, "a", "a2"), rec(0, "a", "a3"), rec(0, "a", "a3")),
			dup:  []string{"a2", "a3"}, found: 5},
		{name: "swapped within an aggregate", rows: rows,
			recs:  []Record{rec(0, "a", "a2"), rec(0, "a", "a1"), rec(0, "a", "a3"), rec(1, "b", "b1"), rec(1, "b", "b2")},
			order: []string{"a1"}, found: 5},
		{name: "a repaired row comes last", rows: rows,
			recs:  []Record{rec(0, "a", "a1"), rec(0, "a", "a3"), rec(1, "b", "b1"), rec(1, "b", "b2"), rec(0, "a", "a2")},
			order: []string{"a2"}, found: 5},
		{name: "aggregates interleave across partitions freely", rows: rows,
			recs: []Record{rec(1, "b", "b1"), rec(1, "b", "b2"), rec(0, "a", "a1"), rec(0, "a", "a2"), rec(0, "a", "a3")}, found: 5},
		{name: "same key in two partitions is two sequences", rows: []string{"x1", "x2", "x3"},
			recs: []Record{rec(1, "x", "x2"), rec(0, "x", "x1"), rec(0, "x", "x3")}, found: 3},
		{name: "records outside the range and without id", rows: []string{"a1"},
			recs:  []Record{rec(0, "a", "old"), {Topic: "t", Key: []byte("a")}, rec(0, "a", "a1")},
			found: 1, outside: 1, withoutID: 1},
		{name: "dead-lettered rows are found, their order is not checked", rows: []string{"a1", "a2"},
			recs: []Record{{Topic: "dlq", Key: []byte("a"), ID: []byte("a2"), HasID: true, DeadLetter: true},
				{Topic: "dlq", Key: []byte("a"), ID: []byte("a1"), HasID: true, DeadLetter: true}},
			found: 2, deadLetter: 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res, missing := run(t, tc.rows, tc.recs)
			if !reflect.DeepEqual(missing, tc.missing) {
				t.Errorf("Check returned missing %v, want %v", missing, tc.missing)
			}
			want := Result{
				Rows: int64(len(tc.rows)), RecordsRead: int64(len(tc.recs)), Found: tc.found,
				DeadLettered: tc.deadLetter, Outside: tc.outside, WithoutID: tc.withoutID,
				Missing: finding(tc.missing), Duplicated: finding(tc.dup), OutOfOrder: finding(tc.order),
			}
			if !reflect.DeepEqual(res, want) {
				t.Errorf("result\n got %+v\nwant %+v", res, want)
			}
		})
	}
}

func finding(ids []string) Finding {
	return Finding{Count: int64(len(ids)), First: append([]string{}, ids...)}
}

// TestSampleBounded: a finding keeps Sample ids however many it counts.
func TestSampleBounded(t *testing.T) {
	var rows []string
	for i := range 100 {
		rows = append(rows, fmt.Sprintf("id%d", i))
	}
	res, missing := run(t, rows, nil)
	if res.Missing.Count != 100 || len(missing) != 100 || len(res.Missing.First) != Sample || res.Missing.First[0] != "id0" {
		t.Fatalf("missing %+v (Check returned %d), want 100 counted, the first %d kept", res.Missing, len(missing), Sample)
	}
}

// TestCheckDetectsAnotherRead: pass 3 must see the rows of pass 1.
func TestCheckDetectsAnotherRead(t *testing.T) {
	c := New()
	c.AddRow(Row{ID: []byte("a")})
	c.Seal()
	if _, ok := c.Check(Row{ID: []byte("b")}); ok {
		t.Error("Check accepted a row pass 1 did not have at that place")
	}
	if _, ok := c.Check(Row{ID: []byte("a")}); !ok {
		t.Error("Check refused the row of pass 1")
	}
	if _, ok := c.Check(Row{ID: []byte("a")}); ok {
		t.Error("Check accepted a row past the end of pass 1")
	}
}

// TestFingerprintSet: a model-based check of the sorted fingerprint index
// against a map, with fixed seeds; colliding fingerprints (forced) resolve
// to the earliest rank, so the later row is reported missing, never hidden.
func TestFingerprintSet(t *testing.T) {
	for seed := uint64(1); seed <= 5; seed++ {
		rnd := rand.New(rand.NewPCG(seed, seed))
		c := New()
		model := map[string]int{}
		var ids []string
		for i := range 2000 {
			id := fmt.Sprintf("%x", rnd.Uint64())
			if _, dup := model[id]; dup {
				continue
			}
			model[id] = len(ids)
			ids = append(ids, id)
			c.AddRow(Row{ID: []byte(id), Topic: fmt.Sprintf("t%d", i%3)})
		}
		c.Seal()
		for id, want := range model {
			got, ok := c.rank(c.Fingerprint([]byte(id)))
			if !ok || int(got) != want {
				t.Fatalf("seed %d: rank(%s) = %d, %v; want %d", seed, id, got, ok, want)
			}
		}
		for range 2000 {
			if _, ok := c.rank(rnd.Uint64()); ok {
				t.Fatalf("seed %d: a random fingerprint matched a row (odds 2000/2^64)", seed)
			}
		}
		if got := c.Topics(); !reflect.DeepEqual(got, []string{"t0", "t1", "t2"}) {
			t.Fatalf("topics %v", got)
		}
	}

	// Forced collision: ranks 0 and 2 share a fingerprint.
	c := New()
	for _, id := range []string{"x", "y", "z"} {
		c.AddRow(Row{ID: []byte(id)})
	}
	c.index[2].hi, c.index[2].lo = c.index[0].hi, c.index[0].lo
	c.Seal()
	c.AddRecord(Record{ID: []byte("x"), HasID: true})
	c.AddRecord(Record{ID: []byte("y"), HasID: true})
	var missing []uint32
	for i := range 3 {
		rk := uint32(i)
		m, ok := c.Check(Row{ID: []byte([]string{"x", "y", "x"}[i])}) // "x" stands in for z's fingerprint
		if !ok {
			t.Fatalf("Check %d refused", i)
		}
		if m {
			missing = append(missing, rk)
		}
	}
	if !reflect.DeepEqual(missing, []uint32{2}) {
		t.Fatalf("with a collision, missing ranks %v, want [2]: the later row is sent again, not hidden", missing)
	}
}

// TestMemoryPerRow pins the per-row cost the package doc states.
func TestMemoryPerRow(t *testing.T) {
	c := New()
	const n = 1 << 16
	for i := range n {
		c.AddRow(Row{ID: fmt.Appendf(nil, "%d", i)})
	}
	c.index = c.index[:n:n]
	c.Seal()
	bytes := int(unsafe.Sizeof(entry{}))*cap(c.index) + 8*cap(c.seen) + 8*cap(c.counted) + 4*cap(c.buckets)
	if per := float64(bytes) / n; per > 12.8 {
		t.Fatalf("%.2f bytes per row, the documented bound is 12.8", per)
	}
}

func BenchmarkCompare(b *testing.B) {
	const n = 1_000_000
	ids := make([][]byte, n)
	for i := range ids {
		ids[i] = fmt.Appendf(nil, "%08x-0000-4000-8000-%012x", i, i*7919)
	}
	b.ResetTimer()
	for range b.N {
		c := New()
		for _, id := range ids {
			c.AddRow(Row{ID: id, Topic: "t"})
		}
		c.Seal()
		for i, id := range ids {
			c.AddRecord(Record{Topic: "t", Partition: int32(i % 3), Key: id[:4], ID: id, HasID: true})
		}
		for _, id := range ids {
			c.Check(Row{ID: id})
		}
	}
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "rows/s")
}
