package inbox

import (
	"context"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
)

// VersionTable returns the name of the table in which ApplyVersion keeps
// the last applied version of each aggregate: "<table>_versions".
func VersionTable(table string) string { return table + "_versions" }

// AggregateVersion returns rec's aggregate version (the aggregate_version
// header, outbox.Event.Version); false when it has none or it is not an
// integer.
func AggregateVersion(rec *kgo.Record) (int64, bool) {
	s, ok := Header(rec, wire.HeaderAggregateVersion)
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseInt(s, 10, 64)
	return v, err == nil
}

// ApplyVersion is the seeds' version guard ("an event older than the local
// version is dropped"), for a handler to call first in tx: it records rec's
// aggregate version as the last one this consumer applied to the aggregate
// (aggregate_type, key) and reports whether it is newer than the one
// recorded before. false means an event of a later version was applied
// already (this one was republished by a replay or a repair, or came from
// another producer late): the handler returns nil without changing
// anything. A record without a version is always applied (true).
//
// The inbox already drops a second delivery of the same event; this drops an
// older event arriving after a newer one, which the inbox cannot know.
func (c *Consumer) ApplyVersion(ctx context.Context, tx pgx.Tx, rec *kgo.Record) (bool, error) {
	v, ok := AggregateVersion(rec)
	if !ok {
		return true, nil
	}
	ev, _ := EventOf(rec)
	tag, err := tx.Exec(ctx, c.version, c.cfg.Consumer, ev.AggregateType, ev.AggregateID, v)
	if err != nil {
		return false, fmt.Errorf("inbox: apply version: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

func versionSQL(qt string) string {
	return "INSERT INTO " + qt + ` AS v (consumer_name, aggregate_type, aggregate_id, version) VALUES ($1, $2, $3, $4)
		ON CONFLICT (consumer_name, aggregate_type, aggregate_id) DO UPDATE SET version = EXCLUDED.version
		WHERE v.version < EXCLUDED.version`
}

func versionTableDDL(qt string) string {
	return fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
  consumer_name  text   NOT NULL,
  aggregate_type text   NOT NULL,
  aggregate_id   text   NOT NULL,
  version        bigint NOT NULL,
  PRIMARY KEY (consumer_name, aggregate_type, aggregate_id)
);
`, qt)
}
