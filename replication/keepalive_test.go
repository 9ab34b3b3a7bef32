package replication

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/metrics"
	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// busyPositions is a tracker with events in flight until done.
type busyPositions struct {
	fixedPositions
	done *atomic.Bool
}

func (p busyPositions) InFlight() int {
	if p.done.Load() {
		return 0
	}
	return 1
}

// TestStreamParksKeepaliveInFlight: while events are in flight a keepalive
// is not handed over alone (the tracker could not apply it): it goes ahead
// of the next batch's messages, or alone once a read times out; with
// nothing in flight it goes at once.
func TestStreamParksKeepaliveInFlight(t *testing.T) {
	for _, tc := range []struct {
		name     string
		inFlight bool
		acked    bool   // what was in flight is acknowledged after the keepalive
		data     bool   // a transaction follows the keepalive
		want     string // the batches, K for a keepalive, | between batches
	}{
		{"in flight, data follows", true, false, true, "KBIC"},
		{"in flight, silence", true, false, false, "K"},
		// Goes within the confirm delay, not the status interval (a minute).
		{"in flight, acknowledged, silence", true, true, false, "K"},
		{"idle", false, false, true, "K|BIC"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			f := newFakeWalsender(t)
			db, err := ParseDB(f.dsn(), nil)
			if err != nil {
				t.Fatal(err)
			}
			cfg := Config{Source: Source{DB: db, Slot: "s", Publication: "p"},
				StatusInterval: time.Minute, ConfirmDelay: 50 * time.Millisecond, ReceiveTimeout: 2 * time.Minute}
			var pos Positions = fixedPositions{make(chan struct{})}
			done := new(atomic.Bool)
			if tc.inFlight {
				pos = busyPositions{fixedPositions{make(chan struct{})}, done}
			}
			s := NewStream(cfg, pos, metrics.New(), slog.New(slog.NewTextHandler(io.Discard, nil)))
			out := make(chan *Batch, 64)
			defer runStream(t, ctx, s, out)()
			w := next(t, ctx, f, out)

			if err := w.keepalive(0x100); err != nil {
				t.Fatalf("keepalive: %v", err)
			}
			if tc.acked {
				time.Sleep(10 * time.Millisecond) // parked by then
				done.Store(true)
			}
			if tc.data {
				// Sent after the keepalive was surely read (parked or
				// handed over), well within the confirm delay.
				time.Sleep(10 * time.Millisecond)
				if err := w.xlogBurst(0x200, []byte("B.."), []byte("I.."), []byte("C..")); err != nil {
					t.Fatalf("send: %v", err)
				}
			}
			var got string
			for len(got) < len(tc.want) {
				select {
				case b := <-out:
					if got != "" {
						got += "|"
					}
					for _, m := range b.Msgs {
						switch m.Kind {
						case Keepalive:
							if m.WALEnd != lsn.LSN(0x100) {
								t.Fatalf("keepalive at %v, want 0/100", m.WALEnd)
							}
							got += "K"
						case Data:
							got += string(m.Data[:1])
						default:
							t.Fatalf("unexpected message %+v", m)
						}
					}
					b.Release()
				case err := <-f.errs:
					t.Fatalf("fake walsender: %v", err)
				case <-ctx.Done():
					t.Fatalf("batches %q, want %q", got, tc.want)
				}
			}
			if got != tc.want {
				t.Fatalf("batches %q, want %q", got, tc.want)
			}
		})
	}
}
