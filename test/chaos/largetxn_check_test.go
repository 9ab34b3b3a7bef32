package chaos

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// largeTxnReport is what the large-transaction kinds wrote and what became
// of their transactions.
type largeTxnReport struct {
	Faults int `json:"faults"`
	Rows   int `json:"rows"`
	// MidTransaction: faults that hit with some but not all of their
	// transaction's events seen by the live consumer.
	MidTransaction int `json:"faults_mid_transaction"`
	// exactly_once: their transactions committed in parts (SplitByDesign,
	// Parts in all) or in one Kafka transaction (KeptWhole).
	SplitByDesign int `json:"split_by_design"`
	Parts         int `json:"parts"`
	KeptWhole     int `json:"kept_whole"`
	// RestKeptWhole: of SplitByDesign, those whose rest a restart kept
	// whole, one last part of more than kafka.max_buffered_records.
	RestKeptWhole int `json:"rest_kept_whole_after_restart"`
	// RecordsWithTxnHeaders: records carrying txn or txn_part outside
	// exactly_once (at_least_once never splits: must be 0).
	RecordsWithTxnHeaders int `json:"records_with_txn_headers"`
}

func (lr *largeTxnReport) String() string {
	return fmt.Sprintf("large transactions: %d faults, %d rows, %d hit mid-transaction; exactly_once: %d committed in parts (%d parts; %d with the rest in one part after a restart), %d kept whole; records with txn headers outside exactly_once %d",
		lr.Faults, lr.Rows, lr.MidTransaction, lr.SplitByDesign, lr.Parts, lr.RestKeptWhole, lr.KeptWhole, lr.RecordsWithTxnHeaders)
}

// checkLargeTxns reports the large-transaction faults' transactions (read
// after checkExactlyOnce) and fails a run in which none of the faults hit
// while the connector published its transaction, or exactly_once committed
// none of them in parts: the kinds exist to put a restart inside one, between
// parts, and a run without any proves nothing of it. Outside exactly_once no
// record may carry the split headers. It returns notes for the log.
func (o *observation) checkLargeTxns(rep *Report, recs []copyRec, fail func(string, ...any)) []string {
	lr := &largeTxnReport{}
	if !o.ExactlyOnce {
		for _, c := range recs {
			if c.Txn != "" || c.TxnPart != "" {
				lr.RecordsWithTxnHeaders++
				if lr.RecordsWithTxnHeaders <= 3 {
					fail("at_least_once: record %s/%d@%d (event %s) carries txn %q txn_part %q", c.Topic, c.Partition, c.Offset, c.ID, c.Txn, c.TxnPart)
				}
			}
		}
	}
	var notes []string
	for _, f := range o.Faults {
		lt := f.Large
		if lt == nil {
			continue
		}
		lr.Faults++
		lr.Rows += lt.Rows
		if lt.SeenAtFault > 0 && lt.SeenAtFault < lt.Rows {
			lr.MidTransaction++
		}
		if !o.ExactlyOnce || rep.ExactlyOnce == nil {
			continue
		}
		k := pgTxn{lt.Writer, lt.Txn}
		if parts := rep.ExactlyOnce.byDesign[k]; parts > 0 {
			lr.SplitByDesign++
			lr.Parts += parts
			if rep.ExactlyOnce.wholeRest[k] {
				lr.RestKeptWhole++
			}
		} else {
			lr.KeptWhole++
			notes = append(notes, fmt.Sprintf("large transaction of %s at %s (writer %d txn %d, %d rows) was committed in one Kafka transaction",
				f.Kind, f.Start.Format("15:04:05.000"), lt.Writer, lt.Txn, lt.Rows))
		}
	}
	if lr.Faults == 0 && lr.RecordsWithTxnHeaders == 0 {
		return nil
	}
	rep.LargeTxns = lr
	if lr.Faults > 0 && lr.MidTransaction == 0 {
		fail("none of the %d large-transaction faults hit while the connector published its transaction (some but not all of its events seen)", lr.Faults)
	}
	if o.ExactlyOnce && lr.Faults > 0 && lr.SplitByDesign == 0 {
		fail("exactly_once: none of the %d large transactions (%d rows, kafka.max_buffered_records %d) was committed in parts", lr.Faults, lr.Rows, partSize)
	}
	return append(notes, lr.String())
}

// largeFixture: one large transaction of writer 9, txn 1, rows events
// over aggregate "L", committed in parts of partSize by producer 20 (one
// epoch per part), with the headers the connector adds.
func largeFixture(t *testing.T, rows int) *checkFixture {
	t.Setenv(EnvDelivery, "exactly_once")
	f := newFixture(t)
	t0 := f.events[3].Committed.Add(time.Second)
	f.o.Faults = append(f.o.Faults, faultRecord{Kind: fConnKillLarge, Start: t0, End: t0.Add(time.Second),
		Large: &largeTxn{Writer: 9, Txn: 1, Rows: rows, SeenAtFault: partSize}})
	n := (rows + partSize - 1) / partSize
	for i := range rows {
		e := event{ID: fmt.Sprintf("L%d", i), Agg: "L", Type: "order", Seq: i + 1, Writer: 9, Txn: 1, Committed: t0}
		f.events = append(f.events, e)
		part := i/partSize + 1
		f.addCopy(e, t0.Add(time.Duration(part)*time.Millisecond), 20)
		c := &f.copies[e.ID][0]
		c.Epoch, c.Txn, c.TxnPart = int16(part), "734@0/16B3748", strconv.Itoa(part)
		if part == n {
			c.TxnPart += "/" + c.TxnPart
		}
		f.recs[len(f.recs)-1] = *c
	}
	for i := range f.events {
		f.byID[f.events[i].ID] = &f.events[i]
	}
	return f
}

// TestCheckSplitByDesign: the parts of a large transaction pass the split
// check and are counted; parts without the headers, a part over two Kafka
// transactions, a last part that does not say "n/n", or a missing part
// count as a split; and a run whose large transactions were all committed
// whole fails.
func TestCheckSplitByDesign(t *testing.T) {
	for _, tc := range []struct {
		name  string
		spoil func(f *checkFixture)
		want  string // in a failure; "" passes
	}{
		{"parts", func(*checkFixture) {}, ""},
		{"an event without headers", func(f *checkFixture) { f.copies["L1500"][0].Txn = "" }, "lacks the txn/txn_part headers"},
		{"a part over two Kafka transactions", func(f *checkFixture) { f.copies["L1500"][0].Epoch = 9 }, "part 2 over two Kafka transactions"},
		{"no last part", func(f *checkFixture) {
			for id, cs := range f.copies {
				if strings.Contains(cs[0].TxnPart, "/") {
					f.copies[id][0].TxnPart = "3"
				}
			}
		}, `no event of its last part ("n/n")`},
		{"a missing part", func(f *checkFixture) {
			for id, cs := range f.copies {
				if cs[0].TxnPart == "2" {
					f.copies[id][0].TxnPart = "4"
				}
			}
		}, "part 2 of 3 missing"},
		{"a part too large", func(f *checkFixture) { f.copies["L1500"][0].TxnPart, f.copies["L1500"][0].Epoch = "1", 1 }, "part 1 holds 1001 events"},
		{"the rest in one part, no restart", func(f *checkFixture) { restInOnePart(f, false) }, "part 2/2 holds 1500 events, more than kafka.max_buffered_records (1000), with no restart before it"},
		{"the rest in one part after a restart", func(f *checkFixture) { restInOnePart(f, true) }, ""},
		{"whole", func(f *checkFixture) {
			for id := range f.copies {
				if strings.HasPrefix(id, "L") {
					f.copies[id][0].Epoch, f.copies[id][0].Txn, f.copies[id][0].TxnPart = 1, "", ""
				}
			}
		}, "none of the 1 large transactions"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := largeFixture(t, 2500)
			tc.spoil(f)
			rep := &Report{}
			f.o.checkExactlyOnce(rep, f.recs, f.copies, f.byID, nil, f.fail)
			f.o.checkLargeTxns(rep, f.recs, f.fail)
			er, lr := rep.ExactlyOnce, rep.LargeTxns
			if tc.want == "" {
				wholeRest := strings.Contains(tc.name, "after a restart")
				if len(f.fails) != 0 || er.SplitByDesign != 1 || er.SplitTransactions != 0 || lr.SplitByDesign != 1 || lr.Parts < 2 ||
					(lr.RestKeptWhole == 1) != wholeRest || (er.RestKeptWhole == 1) != wholeRest {
					t.Fatalf("eos %+v, large %+v, fails %v", er, lr, f.fails)
				}
				return
			}
			if len(f.fails) == 0 || !strings.Contains(strings.Join(f.fails, "\n"), tc.want) || er.SplitByDesign != 0 {
				t.Fatalf("want a failure with %q: eos %+v, fails %v", tc.want, er, f.fails)
			}
		})
	}
}

// restInOnePart puts parts 2 and 3 of largeFixture's transaction in one
// last part, "2/2" (what a restart whose read-back held whole transactions
// back commits), by a process started between the parts if restart.
func restInOnePart(f *checkFixture, restart bool) {
	for id, cs := range f.copies {
		if c := &f.copies[id][0]; strings.HasPrefix(id, "L") && cs[0].TxnPart != "1" {
			c.TxnPart, c.Epoch, c.Append = "2/2", 2, c.Append.Add(-time.Duration(c.Epoch-2)*time.Millisecond)
		}
	}
	if restart {
		part1 := f.copies["L0"][0].Append
		f.o.Incarnations = append(f.o.Incarnations, &incarnation{N: 2, Reason: "after-kill", Start: part1.Add(500 * time.Microsecond)})
	}
}

// TestCheckTxnHeadersAtLeastOnce: at_least_once never splits, so a record
// with the split headers fails it.
func TestCheckTxnHeadersAtLeastOnce(t *testing.T) {
	t.Setenv(EnvDelivery, "")
	f := newFixture(t)
	f.recs[1].Txn, f.recs[1].TxnPart = "734@0/16B3748", "1"
	rep := &Report{}
	f.o.checkLargeTxns(rep, f.recs, f.fail)
	if rep.LargeTxns == nil || rep.LargeTxns.RecordsWithTxnHeaders != 1 || len(f.fails) != 1 {
		t.Fatalf("large %+v, fails %v", rep.LargeTxns, f.fails)
	}
}

// TestCheckLargeTxnMissed: a run whose large-transaction faults all hit
// after their transaction was delivered (or before any of it) fails.
func TestCheckLargeTxnMissed(t *testing.T) {
	t.Setenv(EnvDelivery, "")
	f := newFixture(t)
	f.o.Faults = []faultRecord{{Kind: fPGRestartLarge, Large: &largeTxn{Writer: 9, Txn: 1, Rows: 5000, SeenAtFault: 5000}},
		{Kind: fKafkaKillLarge, Large: &largeTxn{Writer: 9, Txn: 2, Rows: 5000}}}
	rep := &Report{}
	f.o.checkLargeTxns(rep, f.recs, f.fail)
	if len(f.fails) != 1 || !strings.Contains(f.fails[0], "none of the 2 large-transaction faults hit") {
		t.Fatalf("large %+v, fails %v", rep.LargeTxns, f.fails)
	}
	f.fails = nil
	f.o.Faults[1].Large.SeenAtFault = 4999
	f.o.checkLargeTxns(rep, f.recs, f.fail)
	if len(f.fails) != 0 || rep.LargeTxns.MidTransaction != 1 {
		t.Fatalf("one hit mid-transaction: large %+v, fails %v", rep.LargeTxns, f.fails)
	}
}
