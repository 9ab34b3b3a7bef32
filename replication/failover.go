package replication

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Modes of Source.Failover (postgres.failover_slot).
const (
	// FailoverAuto makes the slot a failover slot on PostgreSQL 17+ and
	// runs without one on older servers.
	FailoverAuto = "auto"
	// FailoverOn requires PostgreSQL 17+.
	FailoverOn = "on"
	// FailoverOff (or "") leaves the slot's failover property as it is.
	FailoverOff = "off"
)

// failoverVersion: failover slots (the failover argument of
// pg_create_logical_replication_slot, CREATE_REPLICATION_SLOT ... (FAILOVER),
// ALTER_REPLICATION_SLOT, pg_replication_slots.failover and .synced,
// synchronized_standby_slots, sync_replication_slots) arrived in PostgreSQL 17.
const failoverVersion = 17

func (s Source) wantsFailover() bool { return s.Failover == FailoverAuto || s.Failover == FailoverOn }

// FailoverState says whether a physical standby can take the slot over
// after a promotion (PG 17 docs, "Logical Decoding Concepts",
// "Replication Slot Synchronization").
// It is read on the primary, which cannot see a standby's own settings
// (sync_replication_slots, hot_standby_feedback): those are documented.
type FailoverState struct {
	// Major and Version are the server's; failover slots need 17.
	Major   int
	Version string
	// SlotFailover is pg_replication_slots.failover of the slot: standbys
	// with sync_replication_slots synchronize it.
	SlotFailover bool
	// StandbySlots is the primary's synchronized_standby_slots: the
	// physical slots whose standbys receive a failover slot's changes
	// before any logical walsender sends them.
	StandbySlots []string
	// Active are the StandbySlots that exist, are physical and have a
	// walreceiver streaming from them.
	Active []string
}

// Supported reports whether the server has failover slots.
func (f FailoverState) Supported() bool { return f.Major >= failoverVersion }

// Ready: the slot is a failover slot and a standby that the primary waits
// for streams; so a promoted standby holds the slot at a position no
// newer than the WAL it received.
func (f FailoverState) Ready() bool { return f.Supported() && f.SlotFailover && len(f.Active) > 0 }

// Problem says why the state is not Ready, and what to change; "" when
// it is.
func (f FailoverState) Problem(slot string) (problem, fix string) {
	const standby = "on the standby: sync_replication_slots = on, hot_standby_feedback = on, primary_slot_name set, " +
		"dbname in primary_conninfo (docs/operations.md, \"Failover\")"
	switch {
	case !f.Supported():
		return fmt.Sprintf("failover slots need PostgreSQL %d or later; this server is %s, so a promoted standby has no slot %s",
				failoverVersion, f.Version, slot),
			fmt.Sprintf("upgrade to PostgreSQL %d; until then, after a failover the slot must be recreated and events reconciled", failoverVersion)
	case !f.SlotFailover:
		return fmt.Sprintf("slot %s is not a failover slot: standbys do not synchronize it", slot),
			fmt.Sprintf("restart with postgres.failover_slot auto or on while no other process holds the slot, or run "+
				"ALTER_REPLICATION_SLOT %s (FAILOVER true) on a replication connection", pgx.Identifier{slot}.Sanitize())
	case len(f.StandbySlots) == 0:
		return "the primary's synchronized_standby_slots is empty: a standby may lack changes the connector has confirmed, " +
				"and a promoted standby's slot could skip them",
			"on the primary: ALTER SYSTEM SET synchronized_standby_slots = '<standby's physical slot>'; SELECT pg_reload_conf(); " + standby
	case len(f.Active) == 0:
		return fmt.Sprintf("no standby streams from the physical slots in synchronized_standby_slots (%s): nothing can take the slot over, "+
				"and the connector's stream waits for them", strings.Join(f.StandbySlots, ", ")),
			"start the standby (primary_slot_name one of them), or remove the slot from synchronized_standby_slots; " + standby
	}
	return "", ""
}

// Failover reads the slot's failover state.
func (d *DB) Failover(ctx context.Context, slot string) (FailoverState, error) {
	conn, err := d.connect(ctx)
	if err != nil {
		return FailoverState{}, fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return failoverState(ctx, conn, slot)
}

func failoverState(ctx context.Context, conn *pgx.Conn, slot string) (FailoverState, error) {
	var f FailoverState
	var num int
	var standby string
	// to_jsonb and current_setting(..., true) read as false and "" on
	// servers before 17, whose catalogs lack both.
	if err := conn.QueryRow(ctx, `SELECT current_setting('server_version_num')::int, current_setting('server_version'),
			coalesce((SELECT (to_jsonb(s) ->> 'failover')::boolean FROM pg_replication_slots s WHERE slot_name = $1), false),
			coalesce(current_setting('synchronized_standby_slots', true), '')`, slot).
		Scan(&num, &f.Version, &f.SlotFailover, &standby); err != nil {
		return f, fmt.Errorf("read failover state: %w", err)
	}
	f.Major = num / 10000
	f.StandbySlots = parseSlotList(standby)
	if len(f.StandbySlots) == 0 {
		return f, nil
	}
	rows, err := conn.Query(ctx, `SELECT slot_name::text FROM pg_replication_slots
		WHERE slot_type = 'physical' AND active AND slot_name = ANY($1)`, f.StandbySlots)
	if err != nil {
		return f, fmt.Errorf("read standby slots: %w", err)
	}
	if f.Active, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		return f, fmt.Errorf("read standby slots: %w", err)
	}
	slices.Sort(f.Active)
	return f, nil
}

// parseSlotList splits synchronized_standby_slots, a list of identifiers
// as SplitIdentifierString reads it (src/backend/utils/adt/varlena.c):
// separated by commas, unquoted names folded to lower case, "" inside a
// quoted name standing for one quote. "*" is kept as it is.
func parseSlotList(s string) []string {
	var out []string
	for i := 0; i < len(s); {
		for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == ',') {
			i++
		}
		if i >= len(s) {
			break
		}
		var name strings.Builder
		if s[i] == '"' {
			for i++; i < len(s); i++ {
				if s[i] == '"' {
					if i+1 < len(s) && s[i+1] == '"' {
						name.WriteByte('"')
						i++
						continue
					}
					i++
					break
				}
				name.WriteByte(s[i])
			}
			for i < len(s) && s[i] != ',' {
				i++
			}
		} else {
			j := strings.IndexByte(s[i:], ',')
			if j < 0 {
				j = len(s) - i
			}
			name.WriteString(strings.ToLower(strings.TrimSpace(s[i : i+j])))
			i += j
		}
		if name.Len() > 0 {
			out = append(out, name.String())
		}
	}
	return out
}

// enableFailover makes an existing slot a failover slot with the
// replication command ALTER_REPLICATION_SLOT (PG 17 docs, "Streaming
// Replication Protocol"). It acquires the slot, so it fails while
// another connector streams from it (55006): that one set it up already,
// or the slot monitor reports the slot as not ready.
func enableFailover(ctx context.Context, d *DB, slot string) error {
	rc, err := d.replication(ctx)
	if err != nil {
		return fmt.Errorf("connect: %w", classify(err))
	}
	defer rc.Close(context.WithoutCancel(ctx))
	if _, err := rc.Exec(ctx, fmt.Sprintf("ALTER_REPLICATION_SLOT %s (FAILOVER true)", pgx.Identifier{slot}.Sanitize())).ReadAll(); err != nil {
		return fmt.Errorf("make slot %s a failover slot: %w", slot, err)
	}
	return nil
}
