package pipeline

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/replication"
)

// outbox.source_headers carry the transaction's xid and commit time and the
// WAL position of each insert, as the processor hands them to the router.
func TestSourceHeaders(t *testing.T) {
	c := newCluster(t)
	h := startProcess(t, c, &plan{start: 0x50}, func(cfg *Config) {
		cfg.Routes.StandardHeaders = []string{"id"}
		cfg.Routes.SourceHeaders = []string{"lsn", "xid", "commit_time"}
	})
	msgs := txn(0x100, 4242, outboxRelation(""), insert("e1"), insert("e2"))
	walStart := []lsn.LSN{0xF0, 0xF1, 0xF8, 0xFA, 0x100} // begin, relation, two inserts, commit
	for i, w := range msgs {
		h.send(replication.Message{Kind: replication.Data, Data: w, WALStart: walStart[i]})
	}
	h.acked(0x110)

	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var got [][]kgo.RecordHeader
	for len(got) < 2 {
		fs := cl.PollFetches(h.ctx)
		if h.ctx.Err() != nil {
			t.Fatalf("read %d of 2 records", len(got))
		}
		fs.EachRecord(func(r *kgo.Record) { got = append(got, r.Headers) })
	}
	want := [][]string{
		{"id", "e1", "lsn", "0/F8", "xid", "4242", "commit_time", "2026-01-02T03:04:05.000000Z"},
		{"id", "e2", "lsn", "0/FA", "xid", "4242", "commit_time", "2026-01-02T03:04:05.000000Z"},
	}
	for i, hs := range got {
		var flat []string
		for _, x := range hs {
			flat = append(flat, x.Key, string(x.Value))
		}
		if !equal(flat, want[i]) {
			t.Errorf("record %d headers %q, want %q", i, flat, want[i])
		}
	}
}
