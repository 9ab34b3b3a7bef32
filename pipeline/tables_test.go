package pipeline

import (
	"context"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/decode"
	"github.com/outbox-cdc/outbox-cdc/internal/pgwire"
	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/router"
)

const (
	billingID    = 16400
	billingTopic = "billing.invoice"
)

// billingTable is a second outbox table with other column names, a header
// column and a topic of its own.
func billingTable(c *Config) {
	c.More = []Table{{
		Mapping: decode.Mapping{Schema: "billing", Table: "events", ID: "event_id", AggregateType: "kind",
			AggregateID: "invoice_id", EventType: "name", Payload: "body", HeaderColumns: []string{"region"}},
		Routes: router.Config{TopicTemplate: "billing.{aggregate_type}", DLQTopic: dlqTopic,
			StandardHeaders: []string{"id"}},
	}}
}

func billingRelation() pgwire.Wire {
	return pgwire.Relation(billingID, "billing", "events", pgwire.Col{Name: "event_id", OID: pgwire.OIDText},
		pgwire.Col{Name: "kind", OID: pgwire.OIDText}, pgwire.Col{Name: "invoice_id", OID: pgwire.OIDText},
		pgwire.Col{Name: "name", OID: pgwire.OIDText}, pgwire.Col{Name: "body", OID: pgwire.OIDText},
		pgwire.Col{Name: "region", OID: pgwire.OIDText})
}

func billingInsert(id, invoice string) pgwire.Wire {
	return pgwire.Insert(billingID, pgwire.Txt(id), pgwire.Txt("invoice"), pgwire.Txt(invoice), pgwire.Txt("Paid"),
		pgwire.Txt("{}"), pgwire.Txt("eu"))
}

// Events of two outbox tables in one transaction: each routed by its own
// table's mapping and routes, in insert order per table.
func TestProcessTwoTables(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic, billingTopic, dlqTopic))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	h := startProcess(t, c, &plan{start: 0x50}, billingTable)
	h.data(txn(0x100, 1, outboxRelation(""), billingRelation(), insert("e1"), billingInsert("b1", "inv-1"),
		insert("e2"), billingInsert("b2", "inv-1"))...)
	h.data(txn(0x200, 2, billingInsert("b3", "inv-2"), insert("e3"))...)
	h.acked(0x210)

	if got := records(h.ctx, t, c, topic); !equal(got, []string{"e1", "e2", "e3"}) {
		t.Errorf("%s: %v, want e1 e2 e3", topic, got)
	}
	recs := fetchAll(h.ctx, t, c, billingTopic, 3)
	var ids []string
	for _, r := range recs {
		hdr := map[string]string{}
		for _, x := range r.Headers {
			hdr[x.Key] = string(x.Value)
		}
		ids = append(ids, hdr["id"])
		if hdr["region"] != "eu" || hdr["event_type"] != "" {
			t.Errorf("billing record %s headers %v: want region=eu and only the id standard header", hdr["id"], hdr)
		}
		if want := map[string]string{"b1": "inv-1", "b2": "inv-1", "b3": "inv-2"}[hdr["id"]]; string(r.Key) != want {
			t.Errorf("billing record %s key %q, want %q", hdr["id"], r.Key, want)
		}
	}
	if !equal(ids, []string{"b1", "b2", "b3"}) {
		t.Errorf("%s: %v, want b1 b2 b3", billingTopic, ids)
	}
}

// A Relation of the second table lacking a mapped column after start is a
// schema problem for that table; the first table's position does not decide.
func TestProcessTwoTablesSchemaFrom(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic, billingTopic, dlqTopic))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	// Checked at 0x500 for the first table, 0x150 for the second.
	h := startProcess(t, c, &plan{start: 0x50, schemaFrom: []lsn.LSN{0x500, 0x150}}, billingTable)
	h.data(pgwire.Begin(0x200, at, 1), pgwire.Relation(billingID, "billing", "events",
		pgwire.Col{Name: "event_id", OID: pgwire.OIDText}))
	if err := h.ended(); err == nil || !strings.Contains(err.Error(), "missing from table billing.events") {
		t.Fatalf("processor ended with %v, want the billing table's schema problem", err)
	}
}

// fetchAll reads n records of topic.
func fetchAll(ctx context.Context, t *testing.T, c *kfake.Cluster, topic string, n int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(topic))
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	defer cl.Close()
	var out []*kgo.Record
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d of %d records of %s", len(out), n, topic)
		}
		fs.EachRecord(func(r *kgo.Record) { out = append(out, r) })
	}
	return out
}
