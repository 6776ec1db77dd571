package redislock

// Acceptance tests of the redis_lock handler through Caddy itself (an
// in-process Caddy loaded from a Caddyfile, see harness_test.go), against a
// real redis-server: the rows of the README's responses table, fencing
// tokens, placeholders, release, metrics, reloads and handle_errors.

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"
)

// gate is a backend behaviour that blocks the first n requests until opened
// (or until their context ends), so that a test controls how long a lock is
// held.
type gate struct {
	once sync.Once
	ch   chan struct{}
}

func newGate() *gate { return &gate{ch: make(chan struct{})} }

func (g *gate) open() { g.once.Do(func() { close(g.ch) }) }

func TestHandleErrorsMode(t *testing.T) {
	t.Parallel()
	srv, rdb := newRedis(t)
	be := newRecorder(t, nil)
	s := startCaddySite(t, fmt.Sprintf(`	redis_lock /pay* {http.request.header.Idempotency-Key} {
		redis %s
		errors handle_errors
	}
	reverse_proxy %s
	handle_errors {
		header X-Site-Error yes
		respond "site error page {err.status_code}"
	}`, srv.Addr, be.hostPort()), siteOptions{})

	holdLock(t, rdb, defaultKey("he"), 5*time.Second)
	r := s.do("POST", "/pay", `{}`, "Idempotency-Key", "he")
	if r.Status != http.StatusConflict || r.Body != "site error page 409" || r.Header.Get("X-Site-Error") != "yes" {
		t.Fatalf("409 through handle_errors: %s", r)
	}
	retryAfter(t, r)

	r = s.do("POST", "/pay", `{}`)
	if r.Status != http.StatusBadRequest || r.Body != "site error page 400" {
		t.Fatalf("400 through handle_errors: %s", r)
	}
	if be.executions() != 0 {
		t.Fatalf("backend called %d times", be.executions())
	}
}
