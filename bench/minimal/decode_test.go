package minimal

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
)

func outboxRelation(id uint32, names ...string) *pglogrepl.RelationMessage {
	m := &pglogrepl.RelationMessage{RelationID: id, Namespace: "public", RelationName: "outbox"}
	for _, n := range names {
		m.Columns = append(m.Columns, &pglogrepl.RelationMessageColumn{Name: n})
	}
	return m
}

// text is a tuple column; "\x00" stands for NULL.
func tuple(values ...string) *pglogrepl.TupleData {
	td := &pglogrepl.TupleData{}
	for _, v := range values {
		c := &pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeText, Data: []byte(v)}
		if v == "\x00" {
			c = &pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeNull}
		}
		td.Columns = append(td.Columns, c)
	}
	return td
}

func TestDecoderRecord(t *testing.T) {
	deadline(t, 5*time.Second)
	commit := time.Date(2025, 1, 2, 3, 4, 5, 6000, time.UTC)
	all := []string{"id", "aggregate_type", "aggregate_id", "event_type", "payload", "created_at"}
	cases := []struct {
		name    string
		rel     *pglogrepl.RelationMessage
		ins     *pglogrepl.InsertMessage
		topic   string
		key     string
		value   string
		headers string // key=value,...
		err     string
	}{{
		name:  "every column",
		rel:   outboxRelation(7, all...),
		ins:   &pglogrepl.InsertMessage{RelationID: 7, Tuple: tuple("u1", "order", "agg-1", "Placed", `{"a": 1}`, "2025")},
		topic: "outbox.event.order", key: "agg-1", value: `{"a": 1}`,
		headers: "id=u1,event_type=Placed,aggregate_type=order",
	}, {
		name:  "NULL payload and event type: no value, no header",
		rel:   outboxRelation(7, all...),
		ins:   &pglogrepl.InsertMessage{RelationID: 7, Tuple: tuple("u1", "order", "agg-1", "\x00", "\x00", "2025")},
		topic: "outbox.event.order", key: "agg-1", headers: "id=u1,aggregate_type=order",
	}, {
		name:  "columns in another order",
		rel:   outboxRelation(8, "payload", "aggregate_id", "aggregate_type", "id"),
		ins:   &pglogrepl.InsertMessage{RelationID: 8, Tuple: tuple("{}", "k", "cart", "u2")},
		topic: "outbox.event.cart", key: "k", value: "{}", headers: "id=u2,aggregate_type=cart",
	}, {
		name: "no relation message",
		rel:  outboxRelation(7, all...),
		ins:  &pglogrepl.InsertMessage{RelationID: 9, Tuple: tuple("u1")},
		err:  "before its relation message",
	}, {
		name: "NULL aggregate_type",
		rel:  outboxRelation(7, all...),
		ins:  &pglogrepl.InsertMessage{RelationID: 7, Tuple: tuple("u1", "\x00", "agg-1", "e", "{}", "t")},
		err:  "NULL aggregate_type",
	}, {
		name: "a table without the outbox columns",
		rel:  outboxRelation(7, "id", "name"),
		err:  "no aggregate_type or aggregate_id column",
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := newDecoder("outbox.event.")
			err := d.relation(c.rel)
			var got string
			if err == nil {
				r, rerr := d.record(c.ins, commit)
				err = rerr
				if r != nil {
					var hs []string
					for _, h := range r.Headers {
						hs = append(hs, h.Key+"="+string(h.Value))
					}
					got = strings.Join([]string{r.Topic, string(r.Key), string(r.Value), strings.Join(hs, ",")}, "|")
					if !r.Timestamp.Equal(commit) {
						t.Errorf("timestamp %v, want the commit time %v", r.Timestamp, commit)
					}
				}
			}
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want one containing %q", err, c.err)
				}
				return
			}
			want := strings.Join([]string{c.topic, c.key, c.value, c.headers}, "|")
			if err != nil || got != want {
				t.Fatalf("got %q (err %v), want %q", got, err, want)
			}
		})
	}
}
