package redislock

// ServeHTTP's own path, called directly: requests answered before any lock
// is taken (early data, 425; a client already gone, no answer), and the
// release before the last byte, whatever next does (returns, fails,
// panics).

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
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

func TestReleasedBeforeLastByte(t *testing.T) {
	srv, rdb := newRedis(t)
	h := unitHandler(t, srv.Addr, nil)
	key := engine.Key(DefaultPrefix, "", "k1")

	pw := newProbeWriter()
	var heldAt []bool // per client-side write: was the lock still in Redis?
	pw.onWrite = func([]byte) { heldAt = append(heldAt, keyExists(t, rdb, key)) }
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		w.Header().Set("Content-Length", "11")
		w.Write([]byte("hello"))
		_, err := io.Copy(w, strings.NewReader(" world")) // the ReadFrom path
		return err
	})
	r, repl := unitRequest("POST", "k1", "")
	if err := h.ServeHTTP(pw, r, next); err != nil {
		t.Fatal(err)
	}
	if pw.body.String() != "hello world" {
		t.Fatalf("body %q", pw.body.String())
	}
	if len(heldAt) < 2 || !heldAt[0] || heldAt[len(heldAt)-1] {
		t.Fatalf("lock held at each client write = %v: want held for all but the last, released before it", heldAt)
	}
	if res, _ := repl.GetString(phResult); res != resultAcquired {
		t.Errorf("result %q", res)
	}
	if got, _ := repl.GetString(phKey); got != key {
		t.Errorf("{http.redis_lock.key} = %q, want the hashed key %q", got, key)
	}
}

func TestReleasedWhenNextFailsOrPanics(t *testing.T) {
	srv, rdb := newRedis(t)
	h := unitHandler(t, srv.Addr, nil)
	key := engine.Key(DefaultPrefix, "", "k3")
	boom := errors.New("upstream failed")

	// An error that does not say no backend was reached leaves the outcome
	// unknown: 502 outcome-unknown, as in idempotency mode, and the lock
	// left to its lease (the backend may still be at work).
	r, _ := unitRequest("POST", "k3-unknown", "")
	pw := newProbeWriter()
	err := h.ServeHTTP(pw, r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return boom }))
	unknownKey := engine.Key(DefaultPrefix, "", "k3-unknown")
	if err != nil || pw.status != http.StatusBadGateway || !strings.Contains(pw.body.String(), "outcome-unknown") || !keyExists(t, rdb, unknownKey) {
		t.Fatalf("err %v, status %d, lock left %v: want 502 outcome-unknown and the lock left to its lease", err, pw.status, keyExists(t, rdb, unknownKey))
	}
	// One that says so passes on as it is.
	r, _ = unitRequest("POST", "k3", "")
	refused := caddyhttp.Error(http.StatusServiceUnavailable, boom)
	err = h.ServeHTTP(newProbeWriter(), r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return refused }))
	if !errors.Is(err, boom) || keyExists(t, rdb, key) {
		t.Fatalf("err %v, lock left %v: want next's error and the lock released", err, keyExists(t, rdb, key))
	}

	r, _ = unitRequest("POST", "k3", "")
	func() {
		defer func() {
			if p := recover(); p != "handler panic" {
				t.Errorf("recovered %v, want next's panic re-raised", p)
			}
		}()
		h.ServeHTTP(newProbeWriter(), r, caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error {
			w.Write([]byte("x"))
			panic("handler panic")
		}))
	}()
	if keyExists(t, rdb, key) {
		t.Fatal("lock left in Redis after a panic in next")
	}
}
