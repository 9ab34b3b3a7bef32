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
			if IsFatal(err) != tt.fatal {
				t.Fatalf("classify(%v) fatal = %v, want %v", tt.err, IsFatal(err), tt.fatal)
			}
			var f *FatalError
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

// TestStreamTimelineFork: a reconnect that reaches a server on a new
// timeline resumes when the new history has everything streamed so far, and
// stops with a fatal error when the connector read past the fork.
func TestStreamTimelineFork(t *testing.T) {
	for _, tt := range []struct {
		name   string
		resume lsn.LSN
		fatal  bool
	}{
		{"resume at the fork", 0x200, false},
		{"resume before the fork", 0x100, false},
		{"streamed past the fork", 0x201, true},
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
			// A standby promoted at 0/200 serves the slot now.
			f.promote(2, "1\t0/200\tno recovery target specified\n")
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
			if tt.fatal {
				var fe *FatalError
				select {
				case err := <-done:
					if !errors.As(err, &fe) || fe.Reason != "timeline_fork" || !strings.Contains(err.Error(), "0/200") {
						t.Fatalf("Run: %v, want a timeline_fork fatal error naming the fork 0/200", err)
					}
				case w := <-f.conns:
					t.Fatalf("streaming restarted past the fork: %q", w.start)
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

// TestStreamServerRestored: a reconnect that reaches the same server with
// its WAL ending before the position streaming would resume at (a data
// directory restored from an older copy) stops with a fatal error instead of
// START_REPLICATION there; a WAL end at the position resumes.
func TestStreamServerRestored(t *testing.T) {
	for _, tt := range []struct {
		name   string
		walEnd lsn.LSN
		fatal  bool
	}{
		{"restored to before the resume position", 0x10F, true},
		{"at the resume position", 0x110, false},
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
			f.restore(tt.walEnd)
			w.c.Close()
			for {
				select {
				case b := <-out:
					if !resumeAt(b, 0x110) {
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
			if !tt.fatal {
				w = next(t, ctx, f, out)
				if !strings.Contains(w.start, " 0/110") {
					t.Fatalf("START_REPLICATION %q, want it at 0/110", w.start)
				}
				cancel()
				if err := <-done; err != nil {
					t.Fatalf("Run: %v", err)
				}
				return
			}
			var fe *FatalError
			select {
			case err := <-done:
				if !errors.As(err, &fe) || fe.Reason != "server_rewound" || !strings.Contains(err.Error(), "0/10F") {
					t.Fatalf("Run: %v, want a server_rewound fatal error naming the WAL end 0/10F", err)
				}
			case w := <-f.conns:
				t.Fatalf("streaming restarted past the restored WAL: %q", w.start)
			case <-ctx.Done():
				t.Fatal("Run did not stop")
			}
		})
	}
}
