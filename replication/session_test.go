package replication

import (
	"errors"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

var (
	t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	tc = timing{status: time.Second, confirmDelay: 5 * time.Millisecond, receive: 60 * time.Second}
)

func at(d time.Duration) time.Time { return t0.Add(d) }

func TestStatusDue(t *testing.T) {
	tests := []struct {
		name           string
		now, last      time.Duration
		acked, flushed lsn.LSN
		reply          bool
		want           bool
	}{
		{"nothing moved, interval not over", 500 * time.Millisecond, 0, 10, 10, false, false},
		{"interval over", time.Second, 0, 10, 10, false, true},
		{"reply asked for", time.Millisecond, 0, 10, 10, true, true},
		{"watermark moved, delay not over", 4 * time.Millisecond, 0, 11, 10, false, false},
		{"watermark moved, delay over", 5 * time.Millisecond, 0, 11, 10, false, true},
	}
	for _, tt := range tests {
		if got := tc.statusDue(at(tt.now), at(tt.last), tt.acked, tt.flushed, tt.reply); got != tt.want {
			t.Errorf("%s: statusDue = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestReadDeadline(t *testing.T) {
	quiet := liveness{heard: at(0)}
	tests := []struct {
		name    string
		now     time.Duration
		busy    bool
		live    liveness
		pending bool
		inTxn   bool
		pendAt  time.Duration
		want    time.Time
	}{
		{"idle: the next status update", 0, false, quiet, false, false, 0, at(time.Second)},
		{"events in flight: the confirm delay", 0, true, quiet, false, false, 0, at(5 * time.Millisecond)},
		{"half the receive timeout comes first", 29900 * time.Millisecond, false, liveness{heard: at(-100 * time.Millisecond)},
			false, false, 0, at(29900 * time.Millisecond)},
		{"pinged: the whole receive timeout", 59*time.Second + 500*time.Millisecond, false,
			liveness{heard: at(0), pinged: true}, false, false, 0, at(60 * time.Second)},
		{"a complete batch takes only what is buffered", 0, false, quiet, true, false, 0, burstEnd},
		{"an open transaction waits holdMax for the rest", 0, false, quiet, true, true, 0, at(holdMax)},
		{"holdMax before the confirm delay", 0, true, quiet, true, true, 0, at(holdMax)},
	}
	for _, tt := range tests {
		now := at(tt.now)
		// The last update was sent at now: the interval runs from there.
		status := tc.statusDeadline(now, now, tt.busy)
		if got := tc.readDeadline(status, tt.live, tt.pending, tt.inTxn, at(tt.pendAt)); !got.Equal(tt.want) {
			t.Errorf("%s: readDeadline = %v, want %v", tt.name, got.Sub(t0), tt.want.Sub(t0))
		}
	}
}

func TestLiveness(t *testing.T) {
	timeout := 60 * time.Second
	l := liveness{heard: at(0)}
	if l.pingDue(at(29*time.Second), true, timeout) || !l.pingDue(at(30*time.Second), true, timeout) {
		t.Fatal("a reply is requested from half the receive timeout on")
	}
	if l.pingDue(at(30*time.Second), false, timeout) {
		t.Fatal("no reply is requested while draining")
	}
	l.pinged = true
	if l.pingDue(at(31*time.Second), true, timeout) {
		t.Fatal("one request per silence")
	}
	if err := l.silent(at(59*time.Second), true, timeout); err != nil {
		t.Fatalf("silent before the timeout: %v", err)
	}
	if err := l.silent(at(60*time.Second), true, timeout); !errors.Is(err, errSilent) {
		t.Fatalf("silent at the timeout: %v, want errSilent", err)
	}
	if err := l.silent(at(90*time.Second), false, timeout); err != nil {
		t.Fatalf("draining is never silent: %v", err)
	}
	// A message handled at 40 s counts from the next turn, after it.
	l.fresh = true
	l.turn(at(45 * time.Second))
	if !l.heard.Equal(at(45*time.Second)) || l.pinged || l.fresh {
		t.Fatalf("after a turn: %+v, want heard at 45 s, no ping pending", l)
	}
}
