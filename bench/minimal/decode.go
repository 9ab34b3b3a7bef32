package minimal

import (
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
)

// The outbox table's columns the record is made of (sql/outbox.sql).
const (
	colID            = "id"
	colAggregateType = "aggregate_type"
	colAggregateID   = "aggregate_id"
	colEventType     = "event_type"
	colPayload       = "payload"
)

// columns are a relation's column positions; -1 is absent.
type columns struct{ id, aggType, aggID, eventType, payload int }

// decoder turns pgoutput inserts into records: key aggregate_id, value
// payload, headers id, event_type and aggregate_type (each omitted when
// NULL, as the connector does), topic prefix + aggregate_type, timestamp
// the commit time.
type decoder struct {
	prefix    string
	relations map[uint32]columns
	topics    map[string]string // aggregate_type → topic, so a record costs no concatenation
}

func newDecoder(prefix string) *decoder {
	return &decoder{prefix: prefix, relations: map[uint32]columns{}, topics: map[string]string{}}
}

// relation learns a relation's columns; pgoutput sends it before the
// relation's first change of a session and after every schema change.
func (d *decoder) relation(m *pglogrepl.RelationMessage) error {
	c := columns{-1, -1, -1, -1, -1}
	for i, col := range m.Columns {
		switch col.Name {
		case colID:
			c.id = i
		case colAggregateType:
			c.aggType = i
		case colAggregateID:
			c.aggID = i
		case colEventType:
			c.eventType = i
		case colPayload:
			c.payload = i
		}
	}
	if c.aggType < 0 || c.aggID < 0 {
		return fmt.Errorf("relation %s.%s: no %s or %s column", m.Namespace, m.RelationName, colAggregateType, colAggregateID)
	}
	d.relations[m.RelationID] = c
	return nil
}

// record makes the record of one insert committed at commit.
func (d *decoder) record(m *pglogrepl.InsertMessage, commit time.Time) (*kgo.Record, error) {
	c, ok := d.relations[m.RelationID]
	if !ok {
		return nil, fmt.Errorf("insert into relation %d before its relation message", m.RelationID)
	}
	if m.Tuple == nil {
		return nil, errors.New("insert without a tuple")
	}
	cols := m.Tuple.Columns
	value := func(i int) ([]byte, error) {
		if i < 0 || i >= len(cols) {
			return nil, nil
		}
		switch cols[i].DataType {
		case pglogrepl.TupleDataTypeText:
			return cols[i].Data, nil
		case pglogrepl.TupleDataTypeNull:
			return nil, nil
		}
		return nil, fmt.Errorf("column %d: data type %q, want text or null", i, cols[i].DataType)
	}
	var v [5][]byte
	for j, i := range []int{c.id, c.aggType, c.aggID, c.eventType, c.payload} {
		b, err := value(i)
		if err != nil {
			return nil, err
		}
		v[j] = b
	}
	if v[1] == nil {
		return nil, errors.New("insert with a NULL aggregate_type")
	}
	r := &kgo.Record{Topic: d.topic(v[1]), Key: v[2], Value: v[4], Timestamp: commit,
		Headers: make([]kgo.RecordHeader, 0, 3)}
	for _, h := range []struct {
		key string
		val []byte
	}{{wire.HeaderID, v[0]}, {wire.HeaderEventType, v[3]}, {wire.HeaderAggregateType, v[1]}} {
		if h.val != nil {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: h.key, Value: h.val})
		}
	}
	return r, nil
}

// topic is prefix + aggregateType, made once per aggregate type.
func (d *decoder) topic(aggregateType []byte) string {
	if t, ok := d.topics[string(aggregateType)]; ok { // no allocation: the compiler reads the map in place
		return t
	}
	t := d.prefix + string(aggregateType)
	d.topics[string(aggregateType)] = t
	return t
}
