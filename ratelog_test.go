package redislock

import (
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

// A wrong password fails every request. The 503s go on, but the log gets
// one warning per second, the next one counting those left out.
func TestUnavailableWarningsAreRateLimited(t *testing.T) {
	h, _ := wrongPasswordHandler(t)
	core, logs := observer.New(zap.WarnLevel)
	h.logger = zap.New(core)
	serve := func() int {
		rec := httptest.NewRecorder()
		r, _ := unitRequest("POST", "k", "")
		if err := h.ServeHTTP(rec, r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })); err != nil {
			t.Fatal(err)
		}
		return rec.Code
	}
	const n = 200
	for i := range n {
		if code := serve(); code != http.StatusServiceUnavailable {
			t.Fatalf("request %d with a wrong password: %d, want 503", i, code)
		}
	}
	if got := logs.Len(); got != 1 {
		t.Fatalf("%d warnings for %d failed requests, want 1", got, n)
	}
	// The interval has passed (here without sleeping through it).
	h.unavailable.mu.Lock()
	h.unavailable.next = time.Now()
	h.unavailable.mu.Unlock()
	serve()
	entries := logs.All()
	if len(entries) != 2 {
		t.Fatalf("%d warnings after the interval, want 2", len(entries))
	}
	if got := entries[1].ContextMap()["suppressed"]; got != int64(n-1) {
		t.Fatalf("second warning suppressed = %v, want %d", got, n-1)
	}
}

// A wrong password does not make every request dial a connection of its
// own: after a refusal, connections are not tried for a second.
func TestWrongPasswordDoesNotDialPerRequest(t *testing.T) {
	h, addr := wrongPasswordHandler(t)
	requireFewDials(t, h, addr)
}

// wrongPasswordHandler is a handler whose Redis user, on a server started
// for t at addr, is configured with a wrong password.
func wrongPasswordHandler(t *testing.T) (h *Handler, addr string) {
	t.Helper()
	srv, rdb := newRedis(t)
	if err := rdb.Do(t.Context(), "acl", "setuser", "caddy", "on", ">right", "~*", "&*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	return unitHandler(t, srv.Addr, func(h *Handler) {
		h.Redis.Username, h.Redis.Password = "caddy", "wrong"
	}), srv.Addr
}

// requireFewDials sends 200 requests through h, whose Redis user has a
// wrong password, and checks that each gets 503 and that the servers at
// addrs received a few connections, not one per request.
func requireFewDials(t *testing.T, h *Handler, addrs ...string) {
	t.Helper()
	connections := func() (sum int64) {
		for _, addr := range addrs {
			info, err := redistest.DoString(t.Context(), addr, nil, "INFO", "stats")
			if err != nil {
				t.Fatal(err)
			}
			m := regexp.MustCompile(`total_connections_received:(\d+)`).FindStringSubmatch(info)
			if m == nil {
				t.Fatalf("no total_connections_received in INFO stats of %s", addr)
			}
			n, _ := strconv.ParseInt(m[1], 10, 64)
			sum += n
		}
		return sum
	}
	before := connections()
	for i := range 200 {
		rec := httptest.NewRecorder()
		r, _ := unitRequest("POST", "k", "")
		if err := h.ServeHTTP(rec, r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })); err != nil {
			t.Fatal(err)
		}
		if rec.Code != http.StatusServiceUnavailable {
			t.Fatalf("request %d with a wrong password: %d, want 503", i, rec.Code)
		}
	}
	// One per server is ours (INFO).
	n := connections() - before
	t.Logf("%d connections to %v for 200 requests with a wrong password", n, addrs)
	if n > 10 {
		t.Fatalf("%d connections for 200 requests with a wrong password, want a few", n)
	}
}

// Each kind of warning has its own rate limiter: a flood of one (Redis
// unavailable) does not silence another (an answer not stored).
func TestWarningKindsAreLimitedApart(t *testing.T) {
	srv, _ := newRedis(t)
	h := unitHandler(t, srv.Addr, nil) // provisioned: its limiters as Provision makes them
	core, logs := observer.New(zap.WarnLevel)
	l := zap.New(core)
	kinds := []*rateLimitedWarn{h.unavailable, h.releaseWarn, h.storeWarn, h.unackedWarn, h.abandonWarn}
	for i, w := range kinds {
		for range 10 {
			w.warn(l, "kind "+strconv.Itoa(i))
		}
	}
	if got := logs.Len(); got != len(kinds) {
		t.Fatalf("%d warnings from %d kinds, 10 each, within the interval: want one a kind", got, len(kinds))
	}
}
