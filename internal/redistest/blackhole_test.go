package redistest

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"
)

func TestBlackHole(t *testing.T) {
	t.Parallel()
	h := StartBlackHole(t)
	c, err := net.DialTimeout("tcp", h.Addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	n, err := c.Read(make([]byte, 16))
	var ne net.Error
	if n != 0 || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read %d bytes, %v: want a timeout and nothing", n, err)
	}

	// Do gives up at the context's deadline.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := Do(ctx, h.Addr, nil, "PING"); err == nil {
		t.Fatal("PING to a black hole answered")
	}

	waitCount(t, "accepted", h.Accepted, 2)
	waitCount(t, "open", h.Open, 1) // Do closed its connection
	c.Close()
	waitCount(t, "open", h.Open, 0)

	h.Close()
	if c, err := net.DialTimeout("tcp", h.Addr, 200*time.Millisecond); err == nil {
		c.Close()
		t.Fatal("a closed black hole accepts")
	}
	if a := BlackHole(t); a == h.Addr || a == "" {
		t.Fatalf("second black hole at %q", a)
	}
}

// waitCount waits until get returns want: the Hole counts in its own
// goroutines.
func waitCount(t *testing.T, what string, get func() int, want int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for get() != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s = %d, want %d", what, get(), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
