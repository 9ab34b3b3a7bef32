package inbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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

// The reasons ApplyVersion skips an event: the reason label of
// MetricVersionSkipped.
const (
	// SkipOlder: a later version of the aggregate was applied already.
	SkipOlder = "older"
	// SkipApplied: this event was applied already at its version (its
	// inbox row was cleaned up, or ApplyVersion runs outside the inbox).
	SkipApplied = "applied"
)

// ApplyVersion is the seeds' version guard ("an event older than the local
// version is dropped"), for a handler to call first in tx. It reports
// whether to apply rec: true when rec's aggregate version is newer than the
// last one this consumer applied to the aggregate (aggregate_type, key), or
// equal to it and rec's event (EventID) is not among the events applied at
// that version: an application that writes several outbox rows for one
// change stamps them all with the aggregate's new version, and each of them
// is applied. It records the version and the event in tx.
//
// false means rec is older than a version applied already (it was
// republished by a replay or a repair, or came from another producer late:
// SkipOlder), or is an event applied already (SkipApplied): the handler
// returns nil without changing anything. Each skip is counted in
// MetricVersionSkipped by its reason and logged at debug level. A record
// without a version is always applied (true).
//
// The inbox already drops a second delivery of the same event; this drops an
// older event arriving after a newer one, which the inbox cannot know.
func (c *Consumer) ApplyVersion(ctx context.Context, tx pgx.Tx, rec *kgo.Record) (bool, error) {
	v, ok := AggregateVersion(rec)
	if !ok {
		return true, nil
	}
	ev, _ := EventOf(rec)
	id := dedupeKey(rec, ev, c.cfg.IDHeader)
	tag, err := tx.Exec(ctx, c.version, c.cfg.Consumer, ev.AggregateType, ev.AggregateID, v, id)
	if err != nil {
		return false, c.versionError(err)
	}
	if tag.RowsAffected() == 1 {
		return true, nil
	}
	// Skipped: the version applied says why. The table's name was checked
	// by New.
	vt, _ := quoteTable(VersionTable(c.cfg.Table))
	var applied int64
	if err := tx.QueryRow(ctx, versionReadSQL(vt), c.cfg.Consumer, ev.AggregateType, ev.AggregateID).Scan(&applied); err != nil {
		return false, fmt.Errorf("inbox: apply version: read the applied version: %w", err)
	}
	reason, skips := SkipApplied, c.m.skippedApplied
	if applied > v {
		reason, skips = SkipOlder, c.m.skippedOlder
	}
	skips.Inc()
	c.log.Debug("inbox: event skipped by its aggregate version", "reason", reason, "event_id", id,
		"aggregate_type", ev.AggregateType, "aggregate_id", ev.AggregateID, "version", v, "applied_version", applied)
	return false, nil
}

// versionError wraps an error of the version upsert, saying what to do
// when the table predates its event_ids column.
func (c *Consumer) versionError(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42703" /* undefined_column */ {
		return fmt.Errorf("inbox: apply version: %s was created by an older release: run inbox.CreateTable (or schema.sql) again to add its event_ids column: %w",
			VersionTable(c.cfg.Table), err)
	}
	return fmt.Errorf("inbox: apply version: %w", err)
}

// versionSQL records version $4 and event $5 of an aggregate: a newer
// version replaces the events applied at the one before; the same version
// adds the event, unless it is there already. No row changes: skipped.
func versionSQL(qt string) string {
	return "INSERT INTO " + qt + ` AS v (consumer_name, aggregate_type, aggregate_id, version, event_ids)
		VALUES ($1, $2, $3, $4, ARRAY[$5::text])
		ON CONFLICT (consumer_name, aggregate_type, aggregate_id) DO UPDATE SET version = EXCLUDED.version,
			event_ids = CASE WHEN v.version = EXCLUDED.version THEN v.event_ids || EXCLUDED.event_ids ELSE EXCLUDED.event_ids END
		WHERE v.version < EXCLUDED.version OR (v.version = EXCLUDED.version AND NOT EXCLUDED.event_ids <@ v.event_ids)`
}

func versionReadSQL(qt string) string {
	return "SELECT version FROM " + qt + " WHERE consumer_name = $1 AND aggregate_type = $2 AND aggregate_id = $3"
}

// versionTableDDL: event_ids holds the events applied at version. The
// ALTER adds it to a table created by an older release.
func versionTableDDL(qt string) string {
	return fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %[1]s (
  consumer_name  text   NOT NULL,
  aggregate_type text   NOT NULL,
  aggregate_id   text   NOT NULL,
  version        bigint NOT NULL,
  event_ids      text[] NOT NULL DEFAULT '{}',
  PRIMARY KEY (consumer_name, aggregate_type, aggregate_id)
);
ALTER TABLE %[1]s ADD COLUMN IF NOT EXISTS event_ids text[] NOT NULL DEFAULT '{}';
`, qt)
}
