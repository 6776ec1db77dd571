package redisconn

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

// openNowhere opens a Conn to an address where nothing listens: Open must
// not care.
func openNowhere(t *testing.T) *Conn {
	t.Helper()
	port, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	c, err := Open(Options{Addresses: []string{"127.0.0.1:" + strconv.Itoa(port)}, Timeout: time.Second})
	if err != nil {
		t.Fatalf("Open with Redis down: %v", err)
	}
	return c
}

// isClosed reports whether c's clients are closed.
func isClosed(t *testing.T, c *Conn) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := c.Backend().TryAcquire(ctx, "k", "token", time.Second)
	return errors.Is(err, redis.ErrClosed)
}

// A retired Conn stays open while it is held, and closes when its last
// hold ends; one that nobody holds closes when it is retired.
func TestHoldKeepsRetiredConnOpen(t *testing.T) {
	c := openNowhere(t)
	unholdA, unholdB := c.Hold(), c.Hold()
	if err := c.Destruct(); err != nil {
		t.Fatal(err)
	}
	if isClosed(t, c) {
		t.Fatal("closed while held twice")
	}
	unholdA()
	if isClosed(t, c) {
		t.Fatal("closed while still held once")
	}
	unholdB()
	if !isClosed(t, c) {
		t.Fatal("the last hold ended on a retired Conn: want it closed")
	}
	if err := c.Destruct(); err != nil {
		t.Fatalf("a second Destruct must be harmless: %v", err)
	}

	idle := openNowhere(t)
	idle.Hold()()
	if isClosed(t, idle) {
		t.Fatal("closed by a hold's end, not retired")
	}
	if err := idle.Destruct(); err != nil {
		t.Fatal(err)
	}
	if !isClosed(t, idle) {
		t.Fatal("retired with no hold: want it closed at once")
	}
}

// Every mode opens without contacting Redis (nothing listens on these
// addresses).
func TestOpenEveryMode(t *testing.T) {
	for _, o := range []Options{
		{Mode: Standalone, Addresses: []string{"127.0.0.1:1"}},
		{Mode: Sentinel, MasterName: "m", Addresses: []string{"127.0.0.1:1", "127.0.0.1:2"}},
		{Mode: Cluster, Addresses: []string{"127.0.0.1:1"}},
		{Mode: Redlock, Addresses: []string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"}},
	} {
		c, err := Open(o)
		if err != nil {
			t.Errorf("mode %d: Open: %v", o.Mode, err)
			continue
		}
		if err := c.Destruct(); err != nil {
			t.Errorf("mode %d: Destruct: %v", o.Mode, err)
		}
	}
}
