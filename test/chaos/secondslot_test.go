package chaos

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// A second logical slot on the run's database (pgoutput, never streamed
// from): another consumer of the same WAL, slower than the connector. Every
// secondSlotTick the suite advances it (pg_replication_slot_advance) to the
// WAL insert position it read secondSlotLag before. Retention must never
// delete a row committed after the oldest confirmed_flush_lsn of any logical
// slot of the database. Each row carries "low" (workload_test.go), the WAL
// insert position read inside its transaction before the COMMIT, so its
// commit LSN is above it, and chaos_deleted keeps it: before each advance,
// and once after the last stop, a row retention deleted whose low is at or
// past the second slot's confirmed_flush_lsn was deleted although that slot
// had not confirmed its commit. A promotion (below PostgreSQL 17, or of a
// slot that is not a failover slot) loses the slot: it is created again.

const (
	secondSlotTick = 2 * time.Second
	secondSlotLag  = 15 * time.Second
)

type lsnReading struct {
	at  time.Time
	pos lsn.LSN
}

// deletedRow is a row of chaos_deleted.
type deletedRow struct {
	id, tbl, agg string
	seq          int
	deleted      time.Time
	low          lsn.LSN
}

type secondSlot struct {
	name, dsn string
	lag       time.Duration
	mu        sync.Mutex
	rep       secondSlotReport
	flagged   map[string]bool
	readings  []lsnReading
	// high is the highest position this slot confirmed since it was
	// created: a PostgreSQL crash moves it back to its last persisted
	// state (pg_replication_slot_advance persists at the next checkpoint),
	// and its consumer then decodes the WAL again, which needs no row.
	high lsn.LSN
}

// secondSlotReport is the report's "second_slot" section.
type secondSlotReport struct {
	Slot          string   `json:"slot"`
	Lag           string   `json:"lag"`
	Created       int      `json:"created"` // 1, plus one per promotion that lost it
	Advances      int      `json:"advances"`
	Checks        int      `json:"checks"`
	LastConfirmed string   `json:"last_confirmed"`
	FailedTicks   int      `json:"failed_ticks"` // PostgreSQL down, mostly
	Violations    int      `json:"rows_deleted_past_the_slot"`
	Examples      []string `json:"examples,omitempty"`
}

// setupSecondSlot creates the second slot before the connector starts.
func (r *run) setupSecondSlot(ctx context.Context) {
	s := &secondSlot{name: r.conn.slot + "_second", dsn: r.dsn, lag: secondSlotLag, flagged: map[string]bool{}}
	s.rep.Slot, s.rep.Lag = s.name, s.lag.String()
	conn, err := pgx.Connect(ctx, direct(r.dsn))
	if err != nil {
		r.t.Fatalf("second slot: %v", err)
	}
	defer conn.Close(context.Background())
	if err := s.create(ctx, conn); err != nil {
		r.t.Fatal(err)
	}
	r.second = s
	r.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if c, err := pgx.Connect(ctx, direct(r.dsn)); err == nil {
			_, _ = c.Exec(ctx, "SELECT pg_drop_replication_slot($1)", s.name) // an idle slot keeps WAL
			c.Close(ctx)
		}
	})
}

func (s *secondSlot) create(ctx context.Context, conn *pgx.Conn) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute) // waits for the transactions running (the held ones: seconds)
	defer cancel()
	if _, err := conn.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", s.name); err != nil {
		return fmt.Errorf("create the second slot %s: %w", s.name, err)
	}
	s.mu.Lock()
	s.rep.Created++
	s.readings, s.high = nil, 0 // positions before it are no target
	s.mu.Unlock()
	return nil
}

// run checks and advances the slot every secondSlotTick until ctx ends.
func (s *secondSlot) run(ctx context.Context) {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	t := time.NewTicker(secondSlotTick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if conn == nil || conn.IsClosed() {
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			c, err := pgx.Connect(cctx, direct(s.dsn))
			cancel()
			if err != nil {
				s.failed()
				continue
			}
			conn = c
		}
		if err := s.tick(ctx, conn); err != nil && ctx.Err() == nil {
			s.failed()
			conn.Close(context.Background())
			conn = nil
		}
	}
}

func (s *secondSlot) failed() {
	s.mu.Lock()
	s.rep.FailedTicks++
	s.mu.Unlock()
}

// tick checks the rows deleted so far against the slot's position, then
// advances it to the reading secondSlotLag old.
func (s *secondSlot) tick(ctx context.Context, conn *pgx.Conn) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	confirmed, exists, err := s.check(ctx, conn)
	if err != nil {
		return err
	}
	if !exists {
		return s.create(ctx, conn)
	}
	var insert string
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&insert); err != nil {
		return err
	}
	pos, err := lsn.Parse(insert)
	if err != nil {
		return err
	}
	s.mu.Lock()
	target, ok := s.note(time.Now(), pos)
	s.mu.Unlock()
	if !ok || target <= confirmed {
		return nil
	}
	var end string
	if err := conn.QueryRow(ctx, "SELECT end_lsn::text FROM pg_replication_slot_advance($1, $2::pg_lsn)", s.name, target.String()).Scan(&end); err != nil {
		return fmt.Errorf("advance %s to %v: %w", s.name, target, err)
	}
	to, err := lsn.Parse(end)
	if err != nil {
		return fmt.Errorf("advance %s: %w", s.name, err)
	}
	s.mu.Lock()
	s.rep.Advances++
	// Confirmed now, though only in memory until a checkpoint: retention
	// may delete below it, and a crash taking the slot back does not
	// undo that confirmation (high).
	s.high = max(s.high, to)
	s.mu.Unlock()
	return nil
}

// check reads the slot's confirmed_flush_lsn, then the deleted rows whose
// lower bound is at or past it, and records them as violations.
func (s *secondSlot) check(ctx context.Context, conn *pgx.Conn) (lsn.LSN, bool, error) {
	var confirmed *string
	err := conn.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", s.name).Scan(&confirmed)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	var l lsn.LSN
	if confirmed != nil {
		if l, err = lsn.Parse(*confirmed); err != nil {
			return 0, false, err
		}
	}
	s.mu.Lock()
	cur := l
	l, s.high = max(l, s.high), max(l, s.high)
	s.mu.Unlock()
	rows, err := conn.Query(ctx, "SELECT id, tbl, agg, seq, deleted_at, low::text FROM chaos_deleted WHERE low >= $1::pg_lsn", l.String())
	if err != nil {
		return 0, false, err
	}
	var del []deletedRow
	for rows.Next() {
		var d deletedRow
		var low string
		if err := rows.Scan(&d.id, &d.tbl, &d.agg, &d.seq, &d.deleted, &low); err != nil {
			return 0, false, err
		}
		if d.low, err = lsn.Parse(low); err != nil {
			return 0, false, err
		}
		del = append(del, d)
	}
	if err := rows.Err(); err != nil {
		return 0, false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rep.Checks++
	s.rep.LastConfirmed = cur.String()
	s.flag(l, del)
	return cur, true, nil
}

// flag records the rows deleted although their commit is past confirmed
// (low, below the commit, at or past it), each once.
func (s *secondSlot) flag(confirmed lsn.LSN, rows []deletedRow) {
	for _, d := range rows {
		if d.low < confirmed || s.flagged[d.id] {
			continue
		}
		s.flagged[d.id] = true
		s.rep.Violations++
		if len(s.rep.Examples) < 10 {
			s.rep.Examples = append(s.rep.Examples, fmt.Sprintf("%s (%s %s seq %d) deleted %s, committed past %v, the slot had confirmed %v",
				d.id, d.tbl, d.agg, d.seq, d.deleted.Format("15:04:05.000"), d.low, confirmed))
		}
	}
}

// note records the WAL insert position read at now and returns the
// position to advance to: the newest reading at least s.lag old. Readings
// past pos are of a history the server no longer has (a restore): dropped.
func (s *secondSlot) note(now time.Time, pos lsn.LSN) (lsn.LSN, bool) {
	kept := s.readings[:0]
	for _, rd := range s.readings {
		if rd.pos <= pos {
			kept = append(kept, rd)
		}
	}
	s.readings = append(kept, lsnReading{now, pos})
	cut, found := 0, false
	for i, rd := range s.readings {
		if now.Sub(rd.at) < s.lag {
			break
		}
		cut, found = i, true
	}
	target := s.readings[cut].pos
	s.readings = s.readings[cut:] // the older ones are no target any more
	return target, found
}

// checkSecondSlot reports the slot as its final check after the last stop
// left it (finalSecondSlot), and returns a note for the log: a deletion
// past its position fails the run, and so does a long run in which it never
// advanced (it tested nothing).
func (o *observation) checkSecondSlot(rep *Report, fail func(string, ...any)) string {
	s := o.SecondSlot
	if s == nil {
		return ""
	}
	if s.FinalErr != "" {
		fail("second slot: the final check: %v", s.FinalErr)
	}
	sr := s.Report
	rep.SecondSlot = &sr
	note := fmt.Sprintf("second slot %s (lag %s): created %d times, %d advances, %d checks, last confirmed %s, %d failed ticks; %d rows deleted past it",
		sr.Slot, sr.Lag, sr.Created, sr.Advances, sr.Checks, sr.LastConfirmed, sr.FailedTicks, sr.Violations)
	if sr.Violations > 0 {
		fail("retention deleted %d rows committed past the second logical slot %s's confirmed_flush_lsn; first: %s",
			sr.Violations, s.Name, strings.Join(sr.Examples, "; "))
	}
	if o.Mode == longMode.Name && sr.Advances == 0 {
		fail("the second slot %s never advanced", s.Name)
	}
	return note
}

// TestSecondSlotTarget: the slot goes to the newest reading at least the lag
// old; readings a restore took away are no target.
func TestSecondSlotTarget(t *testing.T) {
	t0 := time.Now()
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	for _, tc := range []struct {
		name     string
		readings []lsnReading
		now      int
		pos      lsn.LSN
		want     lsn.LSN // 0: none
	}{
		{"none old enough", []lsnReading{{at(0), 100}, {at(5), 200}}, 10, 300, 0},
		{"the newest old enough", []lsnReading{{at(0), 100}, {at(5), 200}, {at(8), 250}}, 20, 300, 200},
		{"exactly the lag", []lsnReading{{at(0), 100}, {at(5), 200}}, 15, 300, 100},
		{"a restore took the newer ones", []lsnReading{{at(0), 100}, {at(3), 400}, {at(5), 500}}, 20, 300, 100},
		{"a restore took them all", []lsnReading{{at(0), 400}}, 20, 300, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &secondSlot{lag: 15 * time.Second, readings: tc.readings}
			got, ok := s.note(at(tc.now), tc.pos)
			if !ok {
				got = 0
			}
			if got != tc.want {
				t.Fatalf("target %v (%v), want %v", got, ok, tc.want)
			}
			if last := s.readings[len(s.readings)-1]; last.pos != tc.pos {
				t.Fatalf("last reading %v, want %v", last.pos, tc.pos)
			}
		})
	}
}

// TestSecondSlotFlag: a deleted row whose lower bound is at or past the
// slot's position is a violation, once; one below it is not.
func TestSecondSlotFlag(t *testing.T) {
	s := &secondSlot{flagged: map[string]bool{}}
	rows := []deletedRow{{id: "below", low: 99}, {id: "at", low: 100}, {id: "past", low: 150}}
	s.flag(100, rows)
	s.flag(120, rows)
	if s.rep.Violations != 2 || !s.flagged["at"] || !s.flagged["past"] || s.flagged["below"] {
		t.Fatalf("violations %d, flagged %v", s.rep.Violations, s.flagged)
	}
	if len(s.rep.Examples) != 2 || !strings.Contains(s.rep.Examples[0], "the slot had confirmed 0/64") {
		t.Fatalf("examples %q", s.rep.Examples)
	}
}
