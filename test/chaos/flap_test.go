package chaos

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// fOpsPubFlapStopped: the publication flaps while no connector runs. The
// connector is stopped (SIGTERM) or killed, the outbox leaves the
// publication (ALTER PUBLICATION … DROP TABLE) for 0.5–3 s with the writers
// inserting, comes back (ADD TABLE), and the connector starts 0–1 s later.
// The rows of the flap are in the WAL but pgoutput never decodes them (the
// table was not in the publication as of their changes), and no running
// process saw the table leave: the start must find the publication changed
// since its checkpoint and publish them from the table. Every row of the
// flap must be consumed within flapAwait of the start.
const fOpsPubFlapStopped = "ops-publication-flap-stopped"

// flapAwait bounds the wait for the flap's rows after the start.
const flapAwait = 30 * time.Second

// gapKind: the kinds that take the outbox out of the publication; a process
// started after one may publish the gap's rows from the table.
func gapKind(kind string) bool {
	return kind == fOpsPubGap || kind == fOpsPubGapMsg || kind == fOpsPubFlapStopped
}

func (r *run) opsFlapStopped(ctx context.Context, f *faultRecord) (string, error) {
	var how string
	if r.rng.IntN(2) == 0 {
		old, err := r.conn.kill()
		if err != nil {
			return "", err
		}
		f.Kills++
		how = fmt.Sprintf("#%d killed", old.N)
	} else {
		in := r.conn.current()
		if err := r.conn.stop(time.Minute); err != nil {
			r.opsFailed(fOpsPubFlapStopped, "clean stop before the flap: %v", err)
		}
		how = fmt.Sprintf("#%d stopped (SIGTERM)", in.N)
	}
	pub := pgx.Identifier{r.pub}.Sanitize()
	mark := r.ledger.len()
	if err := r.ddl(ctx, fmt.Sprintf("ALTER PUBLICATION %s DROP TABLE public.outbox", pub)); err != nil {
		return "", err
	}
	removed := time.Now()
	out := r.between(500*time.Millisecond, 3*time.Second)
	sleepCtx(ctx, out) // how long the outbox stays out of the publication, the writers inserting
	readding := time.Now()
	if err := r.addToPublication(ctx); err != nil {
		return "", fmt.Errorf("re-add the outbox to the publication: %w", err)
	}
	// Outbox rows the writers learned committed while it was out (a few
	// may have committed just before the DROP: those are decoded);
	// billing.events never left the publication.
	var gap []event
	for _, e := range r.ledger.since(mark) {
		if !e.Message && !e.Committed.Before(removed) && e.Committed.Before(readding) && !strings.HasPrefix(e.Type, secondTablePrefix) {
			gap = append(gap, e)
		}
	}
	down := r.between(0, time.Second)
	sleepCtx(ctx, down) // the writers go on with the outbox back, before the start
	desc := fmt.Sprintf("connector %s; ALTER PUBLICATION DROP TABLE public.outbox, ADD TABLE %v later, start %v after that; %d outbox rows committed while it was out",
		how, readding.Sub(removed).Round(time.Millisecond), down, len(gap))
	next, err := r.conn.start(ctx, reasonAfterGap)
	if next != nil {
		f.restarted = next.Start
	}
	if err != nil {
		return desc, fmt.Errorf("start after the flap: %w", err)
	}
	desc += fmt.Sprintf("; #%d ready in %v", next.N, next.Ready.Sub(next.Start).Round(time.Millisecond))
	return desc + r.awaitFlap(ctx, gap, next.Start), nil
}

// awaitFlap waits until every row of the flap has been consumed, at most
// flapAwait after the start; a missing one is an operations failure.
func (r *run) awaitFlap(ctx context.Context, gap []event, started time.Time) string {
	deadline := started.Add(flapAwait)
	for {
		var missing []event
		for _, e := range gap {
			if _, ok := r.live.seenAt(e.ID); !ok {
				missing = append(missing, e)
			}
		}
		if len(missing) == 0 {
			return fmt.Sprintf("; all %d consumed %v after the start", len(gap), time.Since(started).Round(time.Millisecond))
		}
		if time.Now().After(deadline) || !sleepCtx(ctx, 50*time.Millisecond) { // poll interval of the live consumer's reads
			e := missing[0]
			r.opsFailed(fOpsPubFlapStopped, "%d of the %d outbox rows committed while the outbox was out of the publication not consumed within %v of the start; first %s (%s seq %d, committed %s, post-commit LSN %v)",
				len(missing), len(gap), flapAwait, e.ID, e.Agg, e.Seq, e.Committed.Format("15:04:05.000"), e.PostLSN)
			return fmt.Sprintf("; %d of %d NOT consumed within %v", len(missing), len(gap), flapAwait)
		}
	}
}
