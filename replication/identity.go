package replication

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pglogrepl"

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
	r, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		return Server{}, fmt.Errorf("identify system: %w", classify(err))
	}
	s := Server{SystemID: r.SystemID, Timeline: r.Timeline, WALEnd: lsn.LSN(r.XLogPos), Database: r.DBName}
	if s.Timeline > 1 { // timeline 1 has no history file
		h, err := pglogrepl.TimelineHistory(ctx, conn, s.Timeline)
		if err != nil {
			return Server{}, fmt.Errorf("timeline history %d: %w", s.Timeline, classify(err))
		}
		if s.History, err = parseHistory(h.Content); err != nil {
			return Server{}, fmt.Errorf("timeline history %d: %w", s.Timeline, err)
		}
	}
	return s, nil
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
