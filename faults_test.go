package redislock

// Faults and hostile input, through Caddy, against real redis-server
// processes: what the client gets and when. These tests are not parallel, so
// that the goroutine count they compare belongs to them alone (parallel
// tests wait until every sequential one has finished).

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

// goroutineBaseline is the goroutine count once s is idle; checkBaseline
// waits until the count is back to it. The sites proxy without keep-alive,
// so that idle upstream connections do not count.
func goroutineBaseline(s *caddySite) int {
	s.client.CloseIdleConnections()
	time.Sleep(100 * time.Millisecond)
	return runtime.NumGoroutine()
}

func checkBaseline(t *testing.T, s *caddySite, base int) {
	t.Helper()
	var n int
	deadline := time.Now().Add(15 * time.Second)
	for {
		s.client.CloseIdleConnections()
		if n = runtime.NumGoroutine(); n <= base {
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines after the fault, baseline %d:\n%s", n, base, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(50 * time.Millisecond)
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
