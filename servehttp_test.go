package redislock

// Tests of ServeHTTP called directly, with a provisioned Handler and a real
// redis-server but no Caddy server around it: the release order against the
// response, lost locks, Redis down, and what reaches the next handler.

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

// unitHandler provisions a handler against the redis-server at addr.
func unitHandler(t *testing.T, addr string, modify func(*Handler)) *Handler {
	t.Helper()
	h := &Handler{Key: "{http.request.header.Idempotency-Key}", Redis: &RedisConfig{Addresses: []string{addr}}}
	if modify != nil {
		modify(h)
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	if err := h.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Cleanup() })
	if err := h.Validate(); err != nil {
		t.Fatal(err)
	}
	return h
}

// unitRequest is a request as Caddy hands it to a handler: with a replacer.
func unitRequest(method, key, body string) (*http.Request, *caddy.Replacer) {
	r := httptest.NewRequest(method, "/checkout", strings.NewReader(body))
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	return r, caddyhttp.NewTestReplacer(r)
}

func TestRedisDown(t *testing.T) {
	port, err := redistest.FreePort() // nothing listens here
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	for _, mode := range []string{OnErrorFailClosed, OnErrorFailOpen} {
		t.Run(mode, func(t *testing.T) {
			h := unitHandler(t, addr, func(h *Handler) { h.OnError = mode })
			rec := httptest.NewRecorder()
			r, repl := unitRequest("POST", "k9", "")
			r.Header.Set("Fencing-Token", "42")
			var upstreamFence *string
			start := time.Now()
			err := h.ServeHTTP(rec, r, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
				f := r.Header.Get("Fencing-Token")
				upstreamFence = &f
				return nil
			}))
			took := time.Since(start)
			t.Logf("%s answered in %v", mode, took)
			if err != nil || took > 500*time.Millisecond { // refused: milliseconds, not go-redis's dial retries
				t.Fatalf("err %v, took %v", err, took)
			}
			res, _ := repl.GetString(phResult)
			switch mode {
			case OnErrorFailClosed:
				if rec.Code != 503 || rec.Header().Get("Retry-After") != "1" || upstreamFence != nil || res != resultUnavailable {
					t.Fatalf("status %d, Retry-After %q, result %q", rec.Code, rec.Header().Get("Retry-After"), res)
				}
				if b := rec.Body.String(); strings.Contains(b, addr) || strings.Contains(b, "refused") {
					t.Errorf("body leaks Redis detail: %s", b)
				}
			case OnErrorFailOpen:
				if upstreamFence == nil || *upstreamFence != "" || res != resultFailOpen {
					t.Fatalf("upstream called %v (fence %v), result %q: want passed on, fence stripped", upstreamFence != nil, upstreamFence, res)
				}
			}
		})
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

func counterValue(t *testing.T, c interface{ Write(*dto.Metric) error }) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
