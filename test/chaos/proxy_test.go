package chaos

import (
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"
)

// echoServer echoes every connection until the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String()
}

func roundTrip(c net.Conn, msg string, timeout time.Duration) (string, error) {
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte(msg)); err != nil {
		return "", err
	}
	buf := make([]byte, len(msg))
	_, err := io.ReadFull(c, buf)
	return string(buf), err
}

func TestProxyModes(t *testing.T) {
	p, err := NewProxy("echo", echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}

	c := dial()
	if got, err := roundTrip(c, "hello", 2*time.Second); err != nil || got != "hello" {
		t.Fatalf("pass-through: %q, %v", got, err)
	}

	// Stall: nothing passes, the connection survives, bytes flow after Heal.
	p.Stall()
	if _, err := roundTrip(c, "stalled", 300*time.Millisecond); err == nil {
		t.Fatal("bytes passed a stalled proxy")
	}
	c2 := dial()
	if _, err := roundTrip(c2, "new", 300*time.Millisecond); err == nil {
		t.Fatal("a new connection passed bytes while stalled")
	}
	p.Heal()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, len("stalled"))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "stalled" {
		t.Fatalf("after stall: %q, %v", buf, err)
	}

	// Slow: each chunk waits.
	p.Slow(200 * time.Millisecond)
	start := time.Now()
	if got, err := roundTrip(c, "slow", 3*time.Second); err != nil || got != "slow" {
		t.Fatalf("slow: %q, %v", got, err)
	}
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Fatalf("slow round trip took %v, want at least 2 × 100ms", d)
	}
	p.Heal()

	// Reset: the client sees a connection reset.
	c3 := dial()
	if _, err := roundTrip(c3, "x", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if n := p.Reset(); n < 1 {
		t.Fatalf("reset %d connections", n)
	}
	_ = c3.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c3.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("read after reset: %v, want ECONNRESET", err)
	}

	// Drop: existing connections end, new ones are refused until Heal.
	c4 := dial()
	if _, err := roundTrip(c4, "y", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Drop()
	_ = c4.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c4.Read(make([]byte, 1)); err == nil {
		t.Fatal("connection survived a drop")
	}
	// Refused: reset at once, which the dial itself may already report.
	if c5, err := net.Dial("tcp", p.Addr()); err == nil {
		_, err = roundTrip(c5, "z", 2*time.Second)
		c5.Close()
		if err == nil {
			t.Fatal("new connection worked during a drop")
		}
	}
	p.Heal()
	if got, err := roundTrip(dial(), "back", 2*time.Second); err != nil || got != "back" {
		t.Fatalf("after heal: %q, %v", got, err)
	}
}
