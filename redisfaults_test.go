package redislock

// Faults of Redis: down (fail_closed, fail_open, and back), accepting
// connections and never answering, paused, dropping pooled connections,
// refusing a command: what the client gets, and when. The tests that take
// a goroutine baseline are not parallel (see goroutineBaseline).

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

func TestRedisUnavailable(t *testing.T) {
	t.Parallel()
	srv, _ := newRedis(t)
	down, _ := newRedis(t)
	down.Stop() // an address where nothing listens
	be := newRecorder(t, nil)
	s := startCaddySite(t, fmt.Sprintf(`	redis_lock /closed* {http.request.header.Idempotency-Key} {
		redis %[1]s
	}
	redis_lock /open* {http.request.header.Idempotency-Key} {
		redis %[1]s
		on_error fail_open
	}
	redis_lock /flaky* {http.request.header.Idempotency-Key} {
		redis %[2]s
	}
	header >X-Lock-Result {http.redis_lock.result}
	reverse_proxy %[3]s`, down.Addr, srv.Addr, be.hostPort()), siteOptions{})

	t.Run("fail_closed", func(t *testing.T) {
		r := s.do("POST", "/closed", `{}`, "Idempotency-Key", "k1")
		expectProblem(t, r, http.StatusServiceUnavailable)
		if got := r.Header.Get("Retry-After"); got != "1" {
			t.Errorf("Retry-After = %q, want 1", got)
		}
		if be.executions() != 0 {
			t.Fatal("fail_closed passed the request on")
		}
	})
	t.Run("fail_open", func(t *testing.T) {
		r := s.do("POST", "/open", `{}`, "Idempotency-Key", "k1", "Fencing-Token", "777")
		if r.Status != 200 {
			t.Fatalf("fail_open: %s", r)
		}
		reqs := be.requests()
		if len(reqs) != 1 || len(reqs[0].Fencing) != 0 {
			t.Fatalf("fail_open: backend saw %d requests, Fencing-Token %v; want 1 without a token", len(reqs), reqs[0].Fencing)
		}
		if got := r.Header.Get("X-Lock-Result"); got != "fail_open" {
			t.Errorf("{http.redis_lock.result} = %q, want fail_open", got)
		}
	})
	t.Run("down and back", func(t *testing.T) {
		if r := s.do("POST", "/flaky", `{}`, "Idempotency-Key", "a"); r.Status != 200 {
			t.Fatalf("before the outage: %s", r)
		}
		srv.Stop()
		r := s.do("POST", "/flaky", `{}`, "Idempotency-Key", "b")
		expectProblem(t, r, http.StatusServiceUnavailable)
		if got := r.Header.Get("Retry-After"); got != "1" {
			t.Errorf("Retry-After = %q, want 1", got)
		}
		if err := srv.Restart(); err != nil {
			t.Fatal(err)
		}
		var last *response
		redistest.Eventually(t, 15*time.Second, "recovery after Redis came back", func() bool {
			last = s.do("POST", "/flaky", `{}`, "Idempotency-Key", "c")
			return last.Status == 200
		})
		if r := s.do("POST", "/flaky", `{}`, "Idempotency-Key", "d"); r.Status != 200 {
			t.Fatalf("after recovery: %s", r)
		}
	})
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

// timedRequests sends n concurrent requests with distinct keys and returns
// each response and how long it took.
func timedRequests(s *caddySite, n int, key string) ([]*response, []time.Duration, []error) {
	resps, took, errs := make([]*response, n), make([]time.Duration, n), make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			resps[i], errs[i] = s.send(context.Background(), "POST", "/pay", `{}`, "Idempotency-Key", fmt.Sprintf("%s-%d", key, i))
			took[i] = time.Since(start)
		}()
	}
	wg.Wait()
	return resps, took, errs
}

// expectBoundedUnavailable checks that every request got 503 within the
// bound of twice the Redis timeout.
func expectBoundedUnavailable(t *testing.T, resps []*response, took []time.Duration, errs []error) {
	t.Helper()
	bound := 2*redisTimeout + slack
	var worst time.Duration
	for i := range resps {
		if errs[i] != nil {
			t.Errorf("request %d: %v", i, errs[i])
			continue
		}
		expectProblem(t, resps[i], http.StatusServiceUnavailable)
		worst = max(worst, took[i])
		if took[i] > bound {
			t.Errorf("request %d answered after %v, want at most %v (timeout %v x 2)", i, took[i], bound, redisTimeout)
		}
	}
	t.Logf("%d requests: slowest 503 after %v", len(resps), worst)
}

// A Redis that accepts connections and never answers: alone and with 50 at
// once, every request gets 503 within twice the timeout.
func TestBlackHoleRedisAnswersInTime(t *testing.T) {
	hole := redistest.StartBlackHole(t)
	be := newRecorder(t, nil)
	s := startCaddySite(t, paySite(hole.Addr, be.hostPort(), faultTimeouts), siteOptions{})
	base := goroutineBaseline(s)
	for _, n := range []int{1, 50} {
		resps, took, errs := timedRequests(s, n, fmt.Sprintf("hole-%d", n))
		expectBoundedUnavailable(t, resps, took, errs)
	}
	if be.executions() != 0 {
		t.Fatalf("backend reached %d times with Redis not answering", be.executions())
	}
	checkBaseline(t, s, base)
}

// A paused Redis (SIGSTOP, as a hung server or a partition): every request
// during the pause gets 503 within twice the timeout, not when Redis comes
// back, and Redis serves again after it.
func TestPausedRedisAnswersInTime(t *testing.T) {
	srv, _ := newRedis(t)
	be := newRecorder(t, nil)
	s := startCaddySite(t, paySite(srv.Addr, be.hostPort(), faultTimeouts), siteOptions{})
	if r := s.do("POST", "/pay", `{}`, "Idempotency-Key", "warm"); r.Status != 200 {
		t.Fatalf("warm-up: %s", r)
	}
	base := goroutineBaseline(s)
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	resumed := false
	t.Cleanup(func() {
		if !resumed {
			_ = srv.Resume()
		}
	})
	pausedAt := time.Now()
	resps, took, errs := timedRequests(s, 50, "paused")
	expectBoundedUnavailable(t, resps, took, errs)
	if d := time.Since(pausedAt); d > 2*time.Second {
		t.Errorf("50 requests took %v in all during the pause", d)
	}
	_ = srv.Resume()
	resumed = true
	redistest.Eventually(t, 10*time.Second, "a lock after Redis resumed", func() bool {
		r, err := s.send(context.Background(), "POST", "/pay", `{}`, "Idempotency-Key", "after")
		return err == nil && r.Status == 200
	})
	checkBaseline(t, s, base)
}

// A pooled connection that Redis dropped (CLIENT KILL) is retried once:
// the request still gets its lock.
func TestDroppedConnectionRetried(t *testing.T) {
	srv, rdb := newRedis(t)
	be := newRecorder(t, nil)
	s := startCaddySite(t, paySite(srv.Addr, be.hostPort(), faultTimeouts), siteOptions{})
	for i := range 5 {
		if r := s.do("POST", "/pay", `{}`, "Idempotency-Key", fmt.Sprintf("pooled-%d", i)); r.Status != 200 {
			t.Fatalf("warm-up: %s", r)
		}
		// Every connection but this test's own, as a Redis restart or an
		// idle timeout would.
		n, err := rdb.ClientKillByFilter(context.Background(), "TYPE", "normal", "SKIPME", "yes").Result()
		if err != nil || n == 0 {
			t.Fatalf("CLIENT KILL: %d, %v", n, err)
		}
		if r := s.do("POST", "/pay", `{}`, "Idempotency-Key", fmt.Sprintf("after-kill-%d", i)); r.Status != 200 {
			t.Fatalf("after CLIENT KILL %d: %s, want 200 (one retry on a new connection)", i, r)
		}
	}
}

// A user who may not run PEXPIRE gets 503, and no lock key without a TTL is
// left behind.
func TestNoLockWithoutTTLThroughCaddy(t *testing.T) {
	srv, rdb := newRedis(t)
	ctx := context.Background()
	if err := rdb.Do(ctx, "acl", "setuser", "caddy", "on", ">pw", "~*", "&*", "+@all", "-pexpire", "-hdel").Err(); err != nil {
		t.Fatal(err)
	}
	be := newRecorder(t, nil)
	s := startCaddySite(t, paySite(srv.Addr, be.hostPort(), redisLines("username caddy", "password pw")), siteOptions{})
	expectProblem(t, s.do("POST", "/pay", `{}`, "Idempotency-Key", "no-ttl"), http.StatusServiceUnavailable)
	if keys := lockKeys(t, rdb, DefaultPrefix); len(keys) != 0 {
		t.Fatalf("lock keys left behind: %v", keys)
	}
	if be.executions() != 0 {
		t.Fatal("backend reached without a lock")
	}
}
