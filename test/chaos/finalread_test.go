package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// tableRow is an outbox row the database holds: in its table, or deleted
// by retention (deleted: when; tbl: which table, for those only).
type tableRow struct {
	Agg     string
	Seq     int
	Tbl     string    `json:",omitempty"`
	Deleted time.Time `json:",omitzero"`
}

func readTable(ctx context.Context, dsn string) (map[string]tableRow, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	// Rows in the tables first: a deletion record never hides one.
	rows, err := conn.Query(ctx, `SELECT id::text, aggregate_id, (payload->>'seq')::int, NULL::timestamptz, '' FROM outbox`+secondTableRows+deletedRows)
	if err != nil {
		return nil, err
	}
	out := map[string]tableRow{}
	for rows.Next() {
		var id string
		var r tableRow
		var deleted *time.Time
		if err := rows.Scan(&id, &r.Agg, &r.Seq, &deleted, &r.Tbl); err != nil {
			return nil, err
		}
		if deleted != nil {
			if _, ok := out[id]; ok {
				continue
			}
			r.Deleted = *deleted
		}
		out[id] = r
	}
	return out, rows.Err()
}

// readAll reads every partition of topics and dlq up to its end offset.
func readAll(ctx context.Context, topics []string, dlq string) (recs, dead []copyRec, err error) {
	cl, err := newKafkaClient()
	if err != nil {
		return nil, nil, err
	}
	all := append(slices.Clone(topics), dlq)
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, all...)
	cl.Close()
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, nil, fmt.Errorf("end offsets: %w", err)
	}
	parts := map[string]map[int32]kgo.Offset{}
	remaining := map[string]map[int32]int64{} // topic → partition → end offset
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset <= 0 {
			return
		}
		if parts[o.Topic] == nil {
			parts[o.Topic] = map[int32]kgo.Offset{}
			remaining[o.Topic] = map[int32]int64{}
		}
		parts[o.Topic][o.Partition] = kgo.NewOffset().AtStart()
		remaining[o.Topic][o.Partition] = o.Offset
	})
	if len(parts) == 0 {
		return nil, nil, nil
	}
	cl, err = newKafkaClient(append([]kgo.Opt{kgo.ConsumePartitions(parts), kgo.FetchMaxBytes(64 << 20)}, isolation()...)...)
	if err != nil {
		return nil, nil, err
	}
	defer cl.Close()
	left := 0
	for _, ps := range remaining {
		left += len(ps)
	}
	for left > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, nil, fmt.Errorf("read topics: %d partitions not read to the end: %w", left, err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if r.Attrs.IsControl() { // a transaction marker (exactly_once run): it only counts toward the end
				if end, ok := remaining[r.Topic][r.Partition]; ok && r.Offset >= end-1 {
					delete(remaining[r.Topic], r.Partition)
					left--
				}
				return
			}
			c := toCopy(r)
			if r.Topic == dlq {
				dead = append(dead, c)
			} else {
				recs = append(recs, c)
			}
			if end, ok := remaining[r.Topic][r.Partition]; ok && r.Offset >= end-1 {
				delete(remaining[r.Topic], r.Partition)
				left--
			}
		})
	}
	sort.Slice(recs, func(i, j int) bool {
		a, b := recs[i], recs[j]
		if a.Topic != b.Topic {
			return a.Topic < b.Topic
		}
		if a.Partition != b.Partition {
			return a.Partition < b.Partition
		}
		return a.Offset < b.Offset
	})
	return recs, dead, nil
}

// toCopy is r as the checks see it.
func toCopy(r *kgo.Record) copyRec {
	c := copyRec{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: string(r.Key),
		Producer: r.ProducerID, Epoch: r.ProducerEpoch, Append: r.Timestamp}
	c.ID, _ = header(r, "id")
	c.Err, c.HasErr = header(r, "error")
	c.Txn, _ = header(r, "txn")
	c.TxnPart, _ = header(r, "txn_part")
	c.LogAppend = r.Attrs.TimestampType() == 1
	var v struct{ Seq int }
	if json.Unmarshal(r.Value, &v) == nil {
		c.Seq = v.Seq
	}
	return c
}
