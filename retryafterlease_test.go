package redislock

import (
	"io"
	"net/http"
	"testing"
	"time"
)

// Through Caddy, a duplicate's Retry-After never exceeds what is left of
// the holder's lease, however long the route's locks are usually held: by
// then the lock is free (released, or its lease run out), and a client
// told to wait longer waits for nothing. With more lease left, the usual
// hold is what it says.
func TestRetryAfterWithinHolderLease(t *testing.T) {
	t.Parallel()
	_, rdb := newRedis(t)
	const (
		hold = 2200 * time.Millisecond // the route's usual hold: Retry-After 3
		left = 900 * time.Millisecond  // the holder's remaining lease: Retry-After 1
	)
	be := newRecorder(t, func(w http.ResponseWriter, r *http.Request, s seen) {
		if s.Key == "long" {
			time.Sleep(hold)
		}
		io.WriteString(w, "ok")
	})
	s := startCaddySite(t, paySite(rdb.Options().Addr, be.hostPort()), siteOptions{})
	if r := s.do("POST", "/pay", `{}`, "Idempotency-Key", "long"); r.Status != http.StatusOK {
		t.Fatalf("the long request: %s", r)
	}

	// Another node holds a key with less than a second of its lease left.
	var last *response
	for range 5 { // on a very slow machine the short lease may run out first
		holdLock(t, rdb, defaultKey("short"), left)
		last = s.do("POST", "/pay", `{}`, "Idempotency-Key", "short")
		if last.Status == http.StatusConflict {
			break
		}
	}
	expectProblem(t, last, http.StatusConflict)
	bound := int((left + time.Second - 1) / time.Second)
	if n := retryAfter(t, last); n > bound {
		t.Errorf("Retry-After = %d with %v of the holder's lease left, want at most %d", n, left, bound)
	}

	// With a long lease left, the usual hold: the route did learn it.
	holdLock(t, rdb, defaultKey("held"), time.Minute)
	r := s.do("POST", "/pay", `{}`, "Idempotency-Key", "held")
	expectProblem(t, r, http.StatusConflict)
	if n, want := retryAfter(t, r), int((hold+time.Second-1)/time.Second); n < want {
		t.Errorf("Retry-After = %d after a %v hold with a minute of lease left, want at least %d", n, hold, want)
	}
	if n := be.executions(); n != 1 {
		t.Fatalf("backend ran %d times, want once (the long request)", n)
	}
}
