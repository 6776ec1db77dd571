package redislock

// Outcomes in idempotency mode: which answers are stored (every answer of
// the backend but the statuses that say "not processed"), none when the
// backend was never reached, outcome-unknown when it was reached and never
// answered (a timeout, a reset, a backend that hangs after its client
// left), not-replayable when the answer cannot be stored, and an answer
// stored for a client that gave up.

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/reqlock/caddy-redis-lock/internal/redistest"
	"github.com/reqlock/caddy-redis-lock/record"
)

// What is stored: every answer of the backend, errors included, except the
// statuses that say "not processed".
func TestIdempotencyStoredStatuses(t *testing.T) {
	t.Parallel()
	srv, rdb := newRedis(t)
	be := chargeBackend(t)
	s := startCaddySite(t, paySite(srv.Addr, be.hostPort(), storedAnswers()), siteOptions{})
	for _, code := range []int{200, 400, 402, 404, 500, 502} {
		key := fmt.Sprintf("status-%d", code)
		path := fmt.Sprintf("/pay/status/%d", code)
		first := s.do("POST", path, `{}`, "Idempotency-Key", key)
		again := s.do("POST", path, `{}`, "Idempotency-Key", key)
		if first.Status != code || again.Status != code || again.Body != first.Body || again.Header.Get(replayedHeader) != "true" {
			t.Errorf("%d: first %s, retry %s; want the first replayed", code, first, again)
		}
		if n := be.executions(key); n != 1 {
			t.Errorf("%d: backend ran %d times, want once", code, n)
		}
	}
	for _, code := range []int{408, 425, 429, 503} {
		key := fmt.Sprintf("status-%d", code)
		path := fmt.Sprintf("/pay/status/%d", code)
		first := s.do("POST", path, `{}`, "Idempotency-Key", key)
		again := s.do("POST", path, `{}`, "Idempotency-Key", key)
		if first.Status != code || again.Header.Get(replayedHeader) != "" || again.Body == first.Body {
			t.Errorf("%d: first %s, retry %s; want the retry run again", code, first, again)
		}
		if n := be.executions(key); n != 2 {
			t.Errorf("%d: backend ran %d times, want twice", code, n)
		}
		if keyExists(t, rdb, record.Key(defaultKey(key))) {
			t.Errorf("%d: a record is left", code)
		}
	}
}

// The backend never reached (connection refused): no record, a retry runs.
func TestIdempotencyBackendNeverReached(t *testing.T) {
	t.Parallel()
	srv, rdb := newRedis(t)
	dead := mustFreePort(t)
	s := startCaddySite(t, paySite(srv.Addr, fmt.Sprintf("127.0.0.1:%d", dead), storedAnswers()), siteOptions{})
	for i := range 2 {
		r := s.do("POST", "/pay", `{}`, "Idempotency-Key", "refused")
		if r.Status != http.StatusBadGateway || r.Header.Get(replayedHeader) != "" {
			t.Fatalf("attempt %d: %s, want a fresh 502", i, r)
		}
	}
	if keyExists(t, rdb, record.Key(defaultKey("refused"))) || keyExists(t, rdb, defaultKey("refused")) {
		t.Fatal("a record or lock is left after the backend was never reached")
	}
}

// The backend reached but never answering (timeout, reset): the outcome is
// unknown, a problem says so, and a retry gets the same problem, never a
// second run.
func TestIdempotencyOutcomeUnknown(t *testing.T) {
	t.Parallel()
	srv, rdb := newRedis(t)
	be := chargeBackend(t)
	s := startCaddySite(t, paySite(srv.Addr, be.hostPort(), storedAnswers()), siteOptions{})
	for _, path := range []string{"/pay/hang", "/pay/reset"} {
		key := "unknown" + strings.ReplaceAll(path, "/", "-")
		first := s.do("POST", path, `{}`, "Idempotency-Key", key)
		p := expectProblem(t, first, http.StatusBadGateway)
		if !strings.HasSuffix(p.Type, "#outcome-unknown") {
			t.Fatalf("%s: problem type %q", path, p.Type)
		}
		again := s.do("POST", path, `{}`, "Idempotency-Key", key)
		expectProblem(t, again, http.StatusBadGateway)
		if again.Header.Get(replayedHeader) != "true" || again.Body != first.Body {
			t.Fatalf("%s retry: %s, want the stored problem", path, again)
		}
		if n := be.executions(key); n != 1 {
			t.Fatalf("%s: backend ran %d times, want once", path, n)
		}
		// An operator who has checked the outcome clears the record, and
		// the next retry runs.
		if err := rdb.Del(context.Background(), record.Key(defaultKey(key))).Err(); err != nil {
			t.Fatal(err)
		}
		s.do("POST", path, `{}`, "Idempotency-Key", key)
		if n := be.executions(key); n != 2 {
			t.Fatalf("%s after DEL of the record: backend ran %d times, want twice", path, n)
		}
	}
}

// A client that left does not cancel its request, but a backend that hangs
// does not hold the key for ever either: a lease after the client went away
// the request ends, and its outcome is unknown.
func TestIdempotencyClientGoneBackendHangs(t *testing.T) {
	t.Parallel()
	srv, _ := newRedis(t)
	be := chargeBackend(t)
	s := startCaddySite(t, paySite(srv.Addr, be.hostPort(), lockLines("ttl 1s"), idempotent()), siteOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	left := time.Now()
	if _, err := s.send(ctx, "POST", "/pay/hang", `{}`, "Idempotency-Key", "hung"); err == nil {
		t.Fatal("an answer from a backend that hangs")
	}
	entered := be.waitEntered(t, 5*time.Second)
	select {
	case <-entered.Ctx.Done():
		if d := time.Since(left); d < 900*time.Millisecond || d > 3*time.Second {
			t.Errorf("backend request ended %v after the client left, want about the 1s lease", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the backend request still runs 5s after its client left")
	}
	var r *response
	redistest.Eventually(t, 5*time.Second, "the stored outcome", func() bool {
		r = s.do("POST", "/pay/hang", `{}`, "Idempotency-Key", "hung")
		return r.Status != http.StatusConflict
	})
	p := expectProblem(t, r, http.StatusBadGateway)
	if !strings.HasSuffix(p.Type, "#outcome-unknown") || r.Header.Get(replayedHeader) != "true" {
		t.Fatalf("retry: %s", r)
	}
	if n := be.executions("hung"); n != 1 {
		t.Fatalf("backend ran %d times", n)
	}
}

// Completed without a body: too large, streamed, HEAD. A duplicate gets a
// problem that says so, never a second run, and not a status that clients
// retry.
func TestIdempotencyNotReplayable(t *testing.T) {
	t.Parallel()
	srv, _ := newRedis(t)
	be := chargeBackend(t)
	s := startCaddySite(t, paySite(srv.Addr, be.hostPort(), storedAnswers()), siteOptions{})
	for _, req := range []struct{ method, path string }{{"POST", "/pay/big"}, {"POST", "/pay/sse"}, {"POST", "/pay/br"}, {"HEAD", "/pay"}} {
		key := "nr-" + req.method + req.path
		first := s.do(req.method, req.path, "", "Idempotency-Key", key)
		if first.Status/100 != 2 {
			t.Fatalf("%s %s: %s", req.method, req.path, first)
		}
		if req.path == "/pay/big" && len(first.Body) != 5000 {
			t.Fatalf("the first client got %d bytes of a 5000-byte answer", len(first.Body))
		}
		again := s.do(req.method, req.path, "", "Idempotency-Key", key)
		if req.method == "HEAD" {
			if again.Status != http.StatusUnprocessableEntity || again.Header.Get(replayedHeader) != "true" {
				t.Fatalf("HEAD retry: %s", again)
			}
		} else {
			p := expectProblem(t, again, http.StatusUnprocessableEntity)
			if !strings.HasSuffix(p.Type, "#not-replayable") || again.Header.Get(replayedHeader) != "true" {
				t.Fatalf("%s retry: %s", req.path, again)
			}
		}
		if n := be.executions(key); n != 1 {
			t.Fatalf("%s %s: backend ran %d times, want once", req.method, req.path, n)
		}
	}
}

// The record outlives the client: a client that gives up does not cancel
// the charge, and its retry gets the stored answer instead of a second one.
func TestIdempotencyOutlivesClient(t *testing.T) {
	t.Parallel()
	srv, _ := newRedis(t)
	be := chargeBackend(t)
	s := startCaddySite(t, paySite(srv.Addr, be.hostPort(), storedAnswers()), siteOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := s.send(ctx, "POST", "/pay/slow", `{}`, "Idempotency-Key", "impatient"); err == nil {
		t.Fatal("the impatient client got an answer within 300ms of an 800ms charge")
	}
	be.waitEntered(t, 5*time.Second)
	var r *response
	redistest.Eventually(t, 10*time.Second, "the stored answer", func() bool {
		r = s.do("POST", "/pay/slow", `{}`, "Idempotency-Key", "impatient")
		return r.Status == 200
	})
	if r.Header.Get(replayedHeader) != "true" || !strings.Contains(r.Body, `"charge":`) {
		t.Fatalf("retry after the client left: %s", r)
	}
	if n := be.executions("impatient"); n != 1 {
		t.Fatalf("backend ran %d times, want once", n)
	}
}

// Outcome unknown in lock mode too: a request written to the backend that
// got no answer is 502 outcome-unknown with Stripe-Should-Retry: false,
// whatever its body (a form, JSON, none), which Go's transport could or
// could not have sent again; its lock is left to its lease.
func TestLockOutcomeUnknown(t *testing.T) {
	t.Parallel()
	srv, _ := newRedis(t)
	be := chargeBackend(t)
	sites := startCaddySites(t, siteOptions{}, paySite(srv.Addr, be.hostPort()), paySite(srv.Addr, "127.0.0.1:1"))
	s, dead := sites[0], sites[1]
	for _, body := range []struct{ name, body, ctype string }{
		{"form", "checkout_token=T0&amount=19.99", "application/x-www-form-urlencoded"},
		{"json", `{"amount":1999}`, "application/json"},
		{"none", "", ""},
	} {
		key := "reset-" + body.name
		r := s.do("POST", "/pay/reset", body.body, "Idempotency-Key", key, "Content-Type", body.ctype)
		p := expectProblem(t, r, http.StatusBadGateway)
		if !strings.HasSuffix(p.Type, "#outcome-unknown") || r.Header.Get("Stripe-Should-Retry") != "false" {
			t.Errorf("%s body: %s, want outcome-unknown without retry", body.name, r)
		}
		if n := be.executions(key); n != 1 {
			t.Errorf("%s body: backend ran %d times, want once", body.name, n)
		}
		// The backend may still be charging: the lock is left to its
		// lease, and a duplicate meanwhile gets 409.
		if d := s.do("POST", "/pay/reset", body.body, "Idempotency-Key", key, "Content-Type", body.ctype); d.Status != http.StatusConflict {
			t.Errorf("%s body: a duplicate after the unknown outcome: %s, want 409 while the lease lasts", body.name, d)
		}
	}
	// Never reached (nothing listens): Caddy's own 502, which a retry may
	// follow.
	r := dead.do("POST", "/pay", "checkout_token=T1", "Idempotency-Key", "refused", "Content-Type", "application/x-www-form-urlencoded")
	if r.Status != http.StatusBadGateway || strings.Contains(r.Body, "outcome-unknown") || r.Header.Get("Stripe-Should-Retry") != "" {
		t.Fatalf("a backend that refused the connection: %s, want Caddy's own 502", r)
	}
}
