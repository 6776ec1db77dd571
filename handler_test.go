package redislock

// Acceptance tests of the redis_lock handler through Caddy itself (an
// in-process Caddy loaded from a Caddyfile, see harness_test.go), against a
// real redis-server: the rows of the README's responses table, fencing
// tokens, placeholders, release, metrics, reloads and handle_errors.

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
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

// TestEarlyDataTooEarly drives ServeHTTP directly: Go's TLS stack neither
// sends nor accepts 0-RTT, so a request with early data cannot be produced
// through Caddy's TLS listener here. Caddy marks such requests (HTTP/3 0-RTT)
// with a TLS state whose handshake is not complete, which is what this sets.
func TestEarlyDataTooEarly(t *testing.T) {
	t.Parallel()
	srv, rdb := newRedis(t)
	var h Handler
	cfg := fmt.Sprintf(`{"key":"{http.request.header.Idempotency-Key}","redis":{"addresses":[%q]}}`, srv.Addr)
	if err := json.Unmarshal([]byte(cfg), &h); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	if err := h.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	if err := h.Validate(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Cleanup() })

	serve := func(state *tls.ConnectionState) (*httptest.ResponseRecorder, int) {
		calls := 0
		next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			calls++
			w.WriteHeader(200)
			return nil
		})
		w := httptest.NewRecorder()
		r := httptest.NewRequest("POST", "https://example.test/pay", strings.NewReader(`{}`))
		r.Header.Set("Idempotency-Key", "early")
		r.TLS = state
		r = caddyhttp.PrepareRequest(r, caddy.NewReplacer(), w, nil)
		if err := h.ServeHTTP(w, r, next); err != nil {
			t.Fatalf("ServeHTTP: %v", err)
		}
		return w, calls
	}

	w, calls := serve(&tls.ConnectionState{HandshakeComplete: false, Version: tls.VersionTLS13})
	if w.Code != http.StatusTooEarly || calls != 0 {
		t.Fatalf("early data: status %d, next called %d times; want 425 and not called", w.Code, calls)
	}
	expectProblem(t, &response{Status: w.Code, Header: w.Header(), Body: w.Body.String()}, http.StatusTooEarly)
	if n := rdb.DBSize(context.Background()).Val(); n != 0 {
		t.Errorf("%d keys in Redis: a lock was taken for a request with early data", n)
	}

	w, calls = serve(&tls.ConnectionState{HandshakeComplete: true, Version: tls.VersionTLS13})
	if w.Code != 200 || calls != 1 {
		t.Fatalf("completed handshake: status %d, next called %d times", w.Code, calls)
	}
}

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
