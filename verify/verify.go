// Package verify compares the outbox rows still in the table with the
// records in Kafka: which rows have no record (missing), which ids have more
// than one (duplicated), and which aggregates' records sit in a partition in
// another order than the table's (out of order). Checker does no I/O: its
// caller feeds it the rows, in table order, twice, and the records in
// between. Run (run.go) is that caller: it reads the rows, the records and
// the rows again through interfaces declared here (Rows, Records), sends the
// missing rows again (Republisher) and decides whether a repair lifts
// retention's holds (Hold); the CLI supplies PostgreSQL, Kafka and the
// producer.
//
// The three passes:
//  1. AddRow for every row in table order: the row's id fingerprint is kept
//     at its rank (its place in that order), and its topic is noted.
//  2. Seal, then AddRecord for every record read from those topics (each
//     partition in offset order): a record whose id is a row's marks that
//     row's rank seen; a second sighting counts the id as duplicated; per
//     aggregate and partition the ranks of first sightings must rise.
//  3. Check for every row again, in the same order (the same snapshot): a
//     rank never seen is a missing row, returned so the caller can repair it.
//
// Memory is bounded by the number of rows, not their size: 12 bytes per row
// (an 8-byte fingerprint and the 4-byte rank, kept sorted by fingerprint) and
// 2 bits (seen, counted as duplicated) and at most half a byte of bucket index, so 10
// million rows take about 130 MB
// (up to twice the 12 bytes while pass 1 grows the slice); plus one map entry
// per aggregate and partition met in Kafka (a 12-byte key and value, about
// 40 bytes with the map's overhead) for the order check. Ids themselves are
// kept only for the first few of each finding (Sample).
//
// Fingerprints are 64-bit hashes (hash/maphash, random seed per run). Two of n
// row ids collide with probability about n²/2⁶⁵ (3·10⁻⁶ for 10 million rows):
// the second of them is then reported missing and a repair sends it again, a
// duplicate and never a loss. A record id outside the rows that collides with
// a row's (about n·m/2⁶⁴ for m records: 5·10⁻⁶ for 10 million of each) makes
// that row look present: the one way a missing row can go unreported.
package verify

import (
	"cmp"
	"hash/maphash"
	"math/bits"
	"slices"
	"sort"
)

// Sample is how many ids each finding keeps for the report.
const Sample = 10

// Row is an outbox row as the pipeline would publish it.
type Row struct {
	ID    []byte
	Topic string // the topic the router chose (the dead-letter topic for a row it refuses)
}

// Record is what the comparison needs of a Kafka record.
type Record struct {
	Topic     string
	Partition int32
	Offset    int64
	Key       []byte
	ID        []byte
	HasID     bool // the id header is present
	// DeadLetter is set for records of the dead-letter topic: a row found
	// there was handled (contract, guarantee 5); its order is not checked.
	DeadLetter bool
}

// Finding is a count and the first few ids.
type Finding struct {
	Count int64    `json:"count"`
	First []string `json:"first"`
}

func (f *Finding) add(id []byte) {
	f.Count++
	if len(f.First) < Sample {
		f.First = append(f.First, string(id))
	}
}

// Result is what a comparison found.
type Result struct {
	Rows        int64 `json:"rows"`
	RecordsRead int64 `json:"records_read"`
	// Found is the rows with at least one record; DeadLettered the rows
	// whose first record is in the dead-letter topic.
	Found        int64 `json:"found"`
	DeadLettered int64 `json:"dead_lettered"`
	// Outside is the records whose id is no row in the range (written
	// before or after it, or deleted since); WithoutID the records with no
	// id header.
	Outside    int64   `json:"records_outside_range"`
	WithoutID  int64   `json:"records_without_id"`
	Missing    Finding `json:"missing"`
	Duplicated Finding `json:"duplicated"`
	OutOfOrder Finding `json:"out_of_order"`
}

// Checker runs one comparison. Not safe for concurrent use.
type Checker struct {
	seed maphash.Seed
	// index holds each row's fingerprint and rank; sorted by fingerprint
	// (then rank) at Seal. 12 bytes an entry: three uint32s, no padding.
	index []entry
	// buckets[b] is the first entry whose fingerprint's top bits are b or
	// more: hashes are uniform, so a lookup scans a few entries of one
	// bucket instead of a binary search's cache misses. 8 to 16 entries a
	// bucket: at most half a byte per row.
	buckets []uint32
	shift   uint // 64 - bits of the bucket number
	topics  map[string]bool
	sealed  bool

	seen    []uint64 // bit per rank: a record was read
	counted []uint64 // bit per rank: counted as duplicated
	// last is, per aggregate (fingerprint of topic, partition and key), one
	// more than the rank of its last first-sighted record.
	last map[uint64]uint32

	checked int64 // rows of pass 3 so far
	res     Result
}

// New returns an empty Checker.
func New() *Checker {
	return &Checker{seed: maphash.MakeSeed(), topics: map[string]bool{}, last: map[uint64]uint32{}}
}

// Fingerprint is the 64-bit hash an id is known by.
func (c *Checker) Fingerprint(id []byte) uint64 { return maphash.Bytes(c.seed, id) }

// entry is a row's fingerprint (hi, lo) and rank.
type entry struct{ hi, lo, rank uint32 }

func (e entry) fp() uint64 { return uint64(e.hi)<<32 | uint64(e.lo) }

func compareEntries(a, b entry) int {
	if c := cmp.Compare(a.fp(), b.fp()); c != 0 {
		return c
	}
	return cmp.Compare(a.rank, b.rank)
}

// AddRow adds the next row in table order (pass 1).
func (c *Checker) AddRow(r Row) {
	fp := c.Fingerprint(r.ID)
	c.index = append(c.index, entry{hi: uint32(fp >> 32), lo: uint32(fp), rank: uint32(len(c.index))})
	if r.Topic != "" {
		c.topics[r.Topic] = true
	}
}

// Topics returns the topics the rows were routed to, sorted.
func (c *Checker) Topics() []string {
	out := make([]string, 0, len(c.topics))
	for t := range c.topics {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}

// Seal ends pass 1: the fingerprints are indexed for lookups.
func (c *Checker) Seal() {
	n := len(c.index)
	// Equal fingerprints keep rank order, so a lookup finds the earliest.
	slices.SortFunc(c.index, compareEntries)
	bitsN := max(bits.Len(uint(n))-4, 0)
	c.shift = uint(64 - bitsN)
	c.buckets = make([]uint32, 1<<bitsN+1)
	b := 0
	for i, e := range c.index {
		for ; b <= int(c.bucket(e.fp())); b++ {
			c.buckets[b] = uint32(i)
		}
	}
	for ; b < len(c.buckets); b++ {
		c.buckets[b] = uint32(n)
	}
	words := (n + 63) / 64
	c.seen, c.counted = make([]uint64, words), make([]uint64, words)
	c.res.Rows = int64(n)
	c.sealed = true
}

func (c *Checker) bucket(fp uint64) uint64 {
	if c.shift == 64 {
		return 0
	}
	return fp >> c.shift
}

// find returns the position in the index of the first entry with
// fingerprint fp.
func (c *Checker) find(fp uint64) (int, bool) {
	b := c.bucket(fp)
	for i := int(c.buckets[b]); i < int(c.buckets[b+1]); i++ {
		if f := c.index[i].fp(); f >= fp {
			return i, f == fp
		}
	}
	return 0, false
}

// rank finds the (first) row whose id has fingerprint fp.
func (c *Checker) rank(fp uint64) (uint32, bool) {
	i, ok := c.find(fp)
	if !ok {
		return 0, false
	}
	return c.index[i].rank, true
}

func bit(set []uint64, i uint32) bool { return set[i/64]&(1<<(i%64)) != 0 }
func setBit(set []uint64, i uint32)   { set[i/64] |= 1 << (i % 64) }

// AddRecord adds a record read from Kafka (pass 2); each partition's records
// must come in offset order.
func (c *Checker) AddRecord(r Record) {
	if !c.sealed {
		panic("verify: AddRecord before Seal")
	}
	c.res.RecordsRead++
	if !r.HasID {
		c.res.WithoutID++
		return
	}
	rk, ok := c.rank(c.Fingerprint(r.ID))
	if !ok {
		c.res.Outside++
		return
	}
	if bit(c.seen, rk) {
		if !bit(c.counted, rk) {
			setBit(c.counted, rk)
			c.res.Duplicated.add(r.ID)
		}
		// A copy sent again after a failure repeats what came before it;
		// only first sightings say in which order the rows arrived.
		return
	}
	setBit(c.seen, rk)
	c.res.Found++
	if r.DeadLetter {
		c.res.DeadLettered++
		return
	}
	agg := c.aggregate(r)
	if prev, ok := c.last[agg]; ok && rk+1 < prev {
		c.res.OutOfOrder.add(r.ID)
		return // the aggregate's high mark stays: later rows are judged against it
	}
	c.last[agg] = rk + 1
}

// aggregate fingerprints an aggregate's place: its records must be in table
// order within one partition of one topic.
func (c *Checker) aggregate(r Record) uint64 {
	var h maphash.Hash
	h.SetSeed(c.seed)
	h.WriteString(r.Topic)
	h.WriteByte(0)
	h.WriteByte(byte(r.Partition >> 24))
	h.WriteByte(byte(r.Partition >> 16))
	h.WriteByte(byte(r.Partition >> 8))
	h.WriteByte(byte(r.Partition))
	h.Write(r.Key)
	return h.Sum64()
}

// Check takes the next row of pass 3 (the rows of pass 1, in the same order)
// and reports whether it is missing. ok is false when the row is not the one
// pass 1 had at this place: the two reads did not return the same rows.
func (c *Checker) Check(r Row) (missing, ok bool) {
	if !c.sealed || c.checked >= int64(len(c.index)) {
		return false, false
	}
	rk := uint32(c.checked)
	fp := c.Fingerprint(r.ID)
	i, found := c.find(fp)
	for found && i < len(c.index) && c.index[i].fp() == fp && c.index[i].rank < rk {
		i++
	}
	if !found || i == len(c.index) || c.index[i].fp() != fp || c.index[i].rank != rk {
		return false, false
	}
	c.checked++
	if bit(c.seen, rk) {
		return false, true
	}
	c.res.Missing.add(r.ID)
	return true, true
}

// Checked is how many rows pass 3 has checked.
func (c *Checker) Checked() int64 { return c.checked }

// Result returns what the comparison found so far; complete after pass 3.
func (c *Checker) Result() Result {
	r := c.res
	// Copies, and [] rather than null in JSON.
	for _, f := range []*Finding{&r.Missing, &r.Duplicated, &r.OutOfOrder} {
		f.First = append([]string{}, f.First...)
	}
	return r
}
