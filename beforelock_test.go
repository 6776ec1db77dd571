package redislock

// Requests answered before any lock is taken: early data (425 Too Early),
// and a client already gone (no answer, result cancelled).

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

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

func TestClientGoneBeforeLock(t *testing.T) {
	srv, _ := newRedis(t)
	h := unitHandler(t, srv.Addr, nil)
	r, repl := unitRequest("POST", "k10", "")
	ctx, cancel := context.WithCancel(r.Context())
	cancel()
	r = r.WithContext(ctx)
	rec := httptest.NewRecorder()
	err := h.ServeHTTP(rec, r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
		t.Error("next called for a gone client")
		return nil
	}))
	if res, _ := repl.GetString(phResult); err != nil || rec.Body.Len() != 0 || res != resultCancelled {
		t.Fatalf("err %v, body %q, result %q", err, rec.Body.String(), res)
	}
}
