package redislock

import (
	"net/http"
	"testing"
	"time"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
)

// The scope and the key are two parts of the lock, not one string: tenant
// "ab" with key "c" and tenant "a" with key "bc" are two locks and two
// records. Were they joined with nothing between, one tenant's request in
// progress would hold up the other's (409), and its stored answer would be
// replayed to it.
func TestScopeAndKeyAreApart(t *testing.T) {
	t.Parallel()
	srv, rdb := newRedis(t)
	be := chargeBackend(t)
	s := startCaddySite(t, paySite(srv.Addr, be.hostPort(), lockLines("scope {http.request.header.X-Tenant}"), storedAnswers()), siteOptions{})
	holdLock(t, rdb, engine.Key(DefaultPrefix, "ab", "c"), 20*time.Second)
	// The held lock is tenant ab's key c: that request waits its turn.
	expectProblem(t, s.do("POST", "/pay", `{}`, "Idempotency-Key", "c", "X-Tenant", "ab"), http.StatusConflict)
	// Tenant a's key bc is another lock: it runs, and its answer is its own.
	first := s.do("POST", "/pay", `{}`, "Idempotency-Key", "bc", "X-Tenant", "a")
	if first.Status != http.StatusCreated || first.Header.Get(replayedHeader) != "" {
		t.Fatalf("tenant a's key bc while tenant ab's key c is held: %s, want it run (201)", first)
	}
	again := s.do("POST", "/pay", `{}`, "Idempotency-Key", "bc", "X-Tenant", "a")
	if again.Header.Get(replayedHeader) != "true" || again.Body != first.Body {
		t.Fatalf("tenant a's retry of key bc: %s, want the replay of %s", again, first)
	}
	if n := be.executions("c"); n != 0 {
		t.Fatalf("tenant ab's key c ran %d times while its lock was held", n)
	}
	if n := be.executions("bc"); n != 1 {
		t.Fatalf("tenant a's key bc ran %d times, want once", n)
	}
}
