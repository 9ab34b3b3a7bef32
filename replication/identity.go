package replication

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-cdc/outbox-cdc/internal/fault"
	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// Server is where a WAL position is meaningful: a position is only valid
// for the cluster (system identifier) and the timeline history it was read
// from (PG docs 55.4, IDENTIFY_SYSTEM and TIMELINE_HISTORY).
type Server struct {
	// SystemID is the cluster's database system identifier, shared by its
	// physical replicas and by backups of it.
	SystemID string
	// Timeline is the server's current timeline.
	Timeline int32
	// WALEnd is the WAL flushed so far (IDENTIFY_SYSTEM xlogpos): no
	// position acknowledged on this server lies beyond it.
	WALEnd lsn.LSN
	// Database is the database of the connection.
	Database string
	// History lists where each ancestor of Timeline ended, oldest first.
	History []TimelineSwitch
}

// TimelineSwitch says timeline Timeline ended at End, where its successor
// in the current history began.
type TimelineSwitch struct {
	Timeline int32
	End      lsn.LSN
}

// Identify reads the server's identity and timeline history on a
// replication connection.
func (d *DB) Identify(ctx context.Context) (Server, error) {
	conn, err := d.replication(ctx)
	if err != nil {
		return Server{}, fmt.Errorf("connect: %w", classify(err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	s, err := identifySystem(ctx, conn)
	if err != nil {
		return Server{}, err
	}
	return s, s.readHistory(ctx, conn)
}

// identifySystem runs IDENTIFY_SYSTEM (PG docs 55.4) on a replication
// connection; the history is not read.
func identifySystem(ctx context.Context, conn *pgconn.PgConn) (Server, error) {
	r, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		return Server{}, fmt.Errorf("identify system: %w", classify(err))
	}
	return Server{SystemID: r.SystemID, Timeline: r.Timeline, WALEnd: lsn.LSN(r.XLogPos), Database: r.DBName}, nil
}

// readHistory reads the current timeline's history (TIMELINE_HISTORY).
func (s *Server) readHistory(ctx context.Context, conn *pgconn.PgConn) error {
	if s.Timeline <= 1 { // timeline 1 has no history file
		return nil
	}
	h, err := pglogrepl.TimelineHistory(ctx, conn, s.Timeline)
	if err != nil {
		return fmt.Errorf("timeline history %d: %w", s.Timeline, classify(err))
	}
	if s.History, err = parseHistory(h.Content); err != nil {
		return fmt.Errorf("timeline history %d: %w", s.Timeline, err)
	}
	return nil
}

// followTimeline decides whether streaming may resume at start after the
// server moved from timeline old to srv.Timeline (a promotion, or a restore
// with PITR). Positions of old up to its fork point are positions of the new
// history too; past it the connector read WAL the new history does not have:
// resuming there would skip what the new timeline wrote between the fork and
// start, and what was published past the fork may never have happened here.
func followTimeline(old int32, start lsn.LSN, srv Server) error {
	fork, ok := srv.ForkPoint(old)
	switch {
	case !ok:
		return &fault.FatalError{Reason: "timeline_fork", Err: &fault.PrerequisiteError{
			Problem: fmt.Sprintf("the server moved from timeline %d to %d, which does not descend from it: positions streamed so far mean nothing here",
				old, srv.Timeline),
			Fix: "check that the DSN reaches the intended cluster; restart the connector to stream from the slot's own position",
		}}
	case start > fork:
		return &fault.FatalError{Reason: "timeline_fork", Err: &fault.PrerequisiteError{
			Problem: fmt.Sprintf("the server moved from timeline %d to %d at %v, but the connector had streamed timeline %d up to %v: "+
				"transactions published after %v may not exist on this server, and resuming would skip what it wrote after %v",
				old, srv.Timeline, fork, old, start, fork, fork),
			Fix: "restart the connector: it streams from the slot's confirmed position (a checkpoint past the fork is refused, with the " +
				"statement to drop it); set synchronized_standby_slots on the primary so a standby always has what the connector read " +
				"(docs/operations.md, Failover)",
		}}
	}
	return nil
}

// sameServer decides whether streaming may resume at start on the server a
// reconnect reached on the timeline it streamed (followTimeline decides a
// new one). It must be the same cluster, and a primary must have WAL up to
// start, which it sent: walsenders send only flushed WAL, so a crash never
// loses it. A WAL end before start is a data directory restored from an
// older copy: START_REPLICATION streams from the greater of the slot's
// position and start (PG docs 55.4), so PostgreSQL would skip every
// transaction the restored server commits below start, and the connector
// confirm past them. A standby is not held to it: after a restart its
// replay begins again at a restartpoint, and IDENTIFY_SYSTEM reports less
// than it sent before until it catches up.
func sameServer(systemID string, start lsn.LSN, srv Server, standby bool) error {
	switch {
	case systemID != "" && srv.SystemID != systemID:
		return &fault.FatalError{Reason: "server_rewound", Err: &fault.PrerequisiteError{
			Problem: fmt.Sprintf("the reconnect reached database system %s, but the connector streamed database system %s: "+
				"positions streamed so far mean nothing there", srv.SystemID, systemID),
			Fix: "check that postgres.dsn reaches the intended cluster; restart the connector to run its start checks",
		}}
	case !standby && srv.WALEnd < start:
		return &fault.FatalError{Reason: "server_rewound", Err: &fault.PrerequisiteError{
			Problem: fmt.Sprintf("the server's WAL ends at %v on timeline %d, before %v, which it had sent the connector: "+
				"it was restored from an older copy of its data directory; resuming would skip every transaction it commits below %v",
				srv.WALEnd, srv.Timeline, start, start),
			Fix: "restart the connector: it streams from the restored slot's position (a checkpoint or a committed Kafka position " +
				"beyond the server's WAL is refused at start, with the way to drop it); what was published from the lost WAL stays " +
				"in Kafka (docs/operations.md, Restores)",
		}}
	}
	return nil
}

// ForkPoint returns the position where timeline tli left the history of the
// server's current timeline: positions of tli up to it are also positions
// of this server. ok is false when tli is not in the history at all.
func (s Server) ForkPoint(tli int32) (at lsn.LSN, ok bool) {
	for _, h := range s.History {
		if h.Timeline == tli {
			return h.End, true
		}
	}
	return 0, false
}

// parseHistory reads a timeline history file: one line per ancestor,
// "parentTLI <tab> switchpoint <tab> reason", comments after '#'
// (PostgreSQL's readTimeLineHistory, src/backend/access/transam/timeline.c).
func parseHistory(content []byte) ([]TimelineSwitch, error) {
	var out []TimelineSwitch
	sc := bufio.NewScanner(bytes.NewReader(content))
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if len(f) < 2 {
			return nil, fmt.Errorf("line %d: %q: want a timeline and a switch point", n, sc.Text())
		}
		tli, err := strconv.ParseUint(f[0], 10, 31)
		if err != nil {
			return nil, fmt.Errorf("line %d: timeline %q: %w", n, f[0], err)
		}
		end, err := lsn.Parse(f[1])
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		if len(out) > 0 && (int32(tli) <= out[len(out)-1].Timeline || end < out[len(out)-1].End) {
			return nil, fmt.Errorf("line %d: timelines and switch points must increase", n)
		}
		out = append(out, TimelineSwitch{Timeline: int32(tli), End: end})
	}
	return out, sc.Err()
}

// standbyMarkWait is how long a standby may take to replay a mark.
const standbyMarkWait = time.Minute

// checkMark refuses to resume at.Pos on a server that lacks the mark that
// proves it (marks.go): the server was restored to a state before the mark's
// commit, so positions above its restore point mean nothing in its new
// history, even once its WAL end has passed them again. The refusal is
// sticky: the mark never comes back.
func (s *Stream) checkMark(ctx context.Context, conn *pgconn.PgConn, at ResumeAt) error {
	if at.Mark == 0 || s.cfg.MarksTable == "" {
		return nil
	}
	found, err := markPresentOn(ctx, conn, s.cfg.MarksTable, s.cfg.Slot, at.Mark)
	// A standby replays what the primary wrote a little later, and after a
	// restart from a restartpoint (sameServer): a mark it lacks may still come.
	for wait := time.Now().Add(standbyMarkWait); err == nil && !found && s.cfg.Standby && time.Now().Before(wait); {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
		found, err = markPresentOn(ctx, conn, s.cfg.MarksTable, s.cfg.Slot, at.Mark)
	}
	if err != nil {
		return err
	}
	if found {
		return nil
	}
	return &fault.FatalError{Reason: "server_rewound", Err: &fault.PrerequisiteError{
		Problem: fmt.Sprintf("the server lacks history mark %d (%s), which the connector decoded at or after %v: it was "+
			"restored from an older copy or replaced by a server that was behind; resuming would skip every transaction "+
			"it commits below %v", at.Mark, s.cfg.MarksTable, at.Pos, at.Pos),
		Fix: "restart the connector: it streams from the restored slot's position (a checkpoint or a committed Kafka position " +
			"the server's history lacks is refused at start, with the way to drop it); what was published from the lost WAL stays " +
			"in Kafka (docs/operations.md, Restores)",
	}}
}
