package replication

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-cdc/outbox-cdc/internal/fault"
	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// TestStatusSend: write is what was received (never below flush), flush =
// apply = acked, and a flush that did not move is sent as zero, so a server
// shutting down does not wait for it (walsender.c, WalSndDone).
func TestStatusSend(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	f := newFakeWalsender(t)
	db, err := ParseDB(f.dsn(), nil)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := db.replication(ctx)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(context.Background())
	if err := pglogrepl.StartReplication(ctx, conn, "s", 0, pglogrepl.StartReplicationOptions{}); err != nil {
		t.Fatalf("start replication: %v", err)
	}
	var w *walConn
	select {
	case w = <-f.conns:
	case <-ctx.Done():
		t.Fatal("no connection")
	}
	st := &status{conn: conn, timeout: time.Second}
	steps := []struct {
		name            string
		received, acked lsn.LSN
		ping            bool
		want            update
	}{
		{"first update confirms acked", 0x80, 0x100, false, update{write: 0x100, flush: 0x100}},
		{"unchanged flush is sent as zero", 0x200, 0x100, false, update{write: 0x200, flush: 0}},
		{"moved flush", 0x200, 0x180, false, update{write: 0x200, flush: 0x180}},
		{"ping asks for a reply", 0x300, 0x180, true, update{write: 0x300, flush: 0, ping: true}},
	}
	for _, s := range steps {
		if err := st.send(s.received, s.acked, time.Now(), s.ping); err != nil {
			t.Fatalf("%s: send: %v", s.name, err)
		}
		select {
		case got := <-w.updates:
			if got != s.want {
				t.Errorf("%s: server got %+v, want %+v", s.name, got, s.want)
			}
		case <-ctx.Done():
			t.Fatalf("%s: no update", s.name)
		}
	}
}

func TestClassify(t *testing.T) {
	pg := func(code string) error { return &pgconn.PgError{Code: code, Message: "m"} }
	tests := []struct {
		name   string
		err    error
		fatal  bool
		reason string
	}{
		{"network error", errors.New("connection reset"), false, ""},
		{"slot held by another connector (standby)", pg("55006"), false, ""},
		{"connection failure", pg("08006"), false, ""},
		{"admin shutdown", pg("57P01"), false, ""},
		{"too many connections", pg("53300"), false, ""},
		{"system error", pg("58030"), false, ""},
		{"slot or publication dropped", pg("42704"), true, "slot_or_publication_missing"},
		{"slot invalidated", pg("55000"), true, "slot_invalidated"},
		{"other server error", pg("42501"), true, "server_error"},
		{"wrapped", fmt.Errorf("receive: %w", pg("42704")), true, "slot_or_publication_missing"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := classify(tt.err)
			if fault.IsFatal(err) != tt.fatal {
				t.Fatalf("classify(%v) fatal = %v, want %v", tt.err, fault.IsFatal(err), tt.fatal)
			}
			var f *fault.FatalError
			if tt.fatal && (!errors.As(err, &f) || f.Reason != tt.reason) {
				t.Fatalf("classify(%v) = %v, want reason %q", tt.err, err, tt.reason)
			}
			if !errors.Is(err, tt.err) {
				t.Fatalf("classify(%v) = %v lost the cause", tt.err, err)
			}
		})
	}
}

// TestStreamResume: after a lost connection the stream asks the receiver
// where the last dispatched transaction ends (Reset) and restarts there.
func TestStreamResume(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	f := newFakeWalsender(t)
	s := newTestStream(f, func(c *Config) {
		c.StartLSN = 0x50
		c.BackoffMax = time.Millisecond
	})
	out := make(chan *Batch, 16)
	defer runStream(t, ctx, s, out)()
	w := next(t, ctx, f, out)
	if !strings.Contains(w.start, " 0/50") {
		t.Fatalf("first START_REPLICATION %q, want it at 0/50", w.start)
	}
	w.c.Close() // the connection is lost
	for {
		select {
		case b := <-out:
			if !resumeAt(b, 0x110) {
				b.Release()
				continue
			}
		case err := <-f.errs:
			t.Fatalf("fake walsender: %v", err)
		case <-ctx.Done():
			t.Fatal("no Reset after the connection was lost")
		}
		break
	}
	w = next(t, ctx, f, out)
	if !strings.Contains(w.start, " 0/110") {
		t.Fatalf("START_REPLICATION after the loss %q, want it at the resumed position 0/110", w.start)
	}
}

// TestStreamReconnectChecks: a reconnect checks the server it reached
// before streaming resumes there. On a new timeline it resumes when the new
// history has everything streamed so far, and stops with a fatal error when
// the connector read past the fork. On the same timeline it stops when the
// server's WAL ends before the resume position (a data directory restored
// from an older copy), and resumes at a WAL end at that position.
func TestStreamReconnectChecks(t *testing.T) {
	promoted := func(f *fakeWalsender) { f.promote(2, "1\t0/200\tno recovery target specified\n") } // at 0/200
	restored := func(at lsn.LSN) func(*fakeWalsender) { return func(f *fakeWalsender) { f.restore(at) } }
	for _, tt := range []struct {
		name    string
		change  func(*fakeWalsender) // what happened to the server while the connection was down
		resume  lsn.LSN
		fatal   string // the fault.FatalError's reason; "" resumes
		mention string // in the fatal error
	}{
		{"new timeline, resume at the fork", promoted, 0x200, "", ""},
		{"new timeline, resume before the fork", promoted, 0x100, "", ""},
		{"new timeline, streamed past the fork", promoted, 0x201, "timeline_fork", "0/200"},
		{"restored to before the resume position", restored(0x10F), 0x110, "server_rewound", "0/10F"},
		{"WAL end at the resume position", restored(0x110), 0x110, "", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			f := newFakeWalsender(t)
			s := newTestStream(f, func(c *Config) {
				c.StartLSN = 0x50
				c.BackoffMax = time.Millisecond
			})
			out := make(chan *Batch, 16)
			done := make(chan error, 1)
			go func() { done <- s.Run(ctx, out) }()
			w := next(t, ctx, f, out)
			tt.change(f)
			w.c.Close()
			for {
				select {
				case b := <-out:
					if !resumeAt(b, tt.resume) {
						b.Release()
						continue
					}
				case err := <-done:
					t.Fatalf("Run ended before the reconnect: %v", err)
				case <-ctx.Done():
					t.Fatal("no Reset after the connection was lost")
				}
				break
			}
			if tt.fatal != "" {
				var fe *fault.FatalError
				select {
				case err := <-done:
					if !errors.As(err, &fe) || fe.Reason != tt.fatal || !strings.Contains(err.Error(), tt.mention) {
						t.Fatalf("Run: %v, want a %s fatal error naming %s", err, tt.fatal, tt.mention)
					}
				case w := <-f.conns:
					t.Fatalf("streaming restarted: %q", w.start)
				case <-ctx.Done():
					t.Fatal("Run did not stop")
				}
				return
			}
			w = next(t, ctx, f, out)
			if want := fmt.Sprintf(" %v", tt.resume); !strings.Contains(w.start, want) {
				t.Fatalf("START_REPLICATION %q, want it at %v", w.start, tt.resume)
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("Run: %v", err)
			}
		})
	}
}
