package redislock

// Config reloads: the metrics go on counting across them, and a reload that
// changes a Redis setting keeps the locks of the requests in flight until
// they end.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

func TestMetricsAndReload(t *testing.T) {
	t.Parallel()
	srv, rdb := newRedis(t)
	be := newRecorder(t, nil)
	s := startCaddySite(t, paySite(srv.Addr, be.hostPort()), siteOptions{admin: true})

	counter := func(result string) float64 {
		t.Helper()
		return requestsCounter(t, s, result)
	}
	traffic := func(round int) {
		t.Helper()
		key := fmt.Sprintf("metric-key-%d", round)
		if r := s.do("POST", "/pay", `{}`, "Idempotency-Key", key); r.Status != 200 {
			t.Fatalf("%s", r)
		}
		holdLock(t, rdb, defaultKey(key), 5*time.Second)
		expectProblem(t, s.do("POST", "/pay", `{}`, "Idempotency-Key", key), http.StatusConflict)
		expectProblem(t, s.do("POST", "/pay", `{}`), http.StatusBadRequest)
	}

	a0, c0 := counter("acquired"), counter("conflict")
	traffic(1)
	a1, c1 := counter("acquired"), counter("conflict")
	if a1 < a0+1 || c1 < c0+1 {
		t.Fatalf("after one acquired and one conflict: acquired %v -> %v, conflict %v -> %v", a0, a1, c0, c1)
	}
	r, _ := sendRequest(context.Background(), s.client, "GET", s.AdminURL+"/metrics", "")
	for _, name := range []string{"caddy_redis_lock_hold_seconds", "caddy_redis_lock_release_total"} {
		if !strings.Contains(r.Body, name) {
			t.Errorf("metric %s missing from /metrics", name)
		}
	}

	for i := range 2 {
		s.reload()
		traffic(2 + i)
		a2, c2 := counter("acquired"), counter("conflict")
		if a2 < a1+1 || c2 < c1+1 {
			t.Fatalf("after reload %d: acquired %v -> %v, conflict %v -> %v", i+1, a1, a2, c1, c2)
		}
		a1, c1 = a2, c2
	}
}

// A config reload that changes a Redis setting retires the old client, but
// not under the requests in flight: their locks stay held (renewed) until
// they end, duplicates still get 409, and their releases work.
func TestReloadKeepsLocksInFlight(t *testing.T) {
	srv, rdb := newRedis(t)
	g := newGate()
	t.Cleanup(g.open)
	be := newRecorder(t, func(w http.ResponseWriter, r *http.Request, s seen) {
		if strings.HasPrefix(s.Key, "inflight-") {
			select {
			case <-g.ch:
			case <-r.Context().Done():
				return
			}
		}
		io.WriteString(w, "ok")
	})
	site := func(timeout string) string {
		return paySite(srv.Addr, be.hostPort(), lockLines("ttl 1s"), redisLines("timeout "+timeout), proxyTransport("keepalive off"))
	}
	s := startCaddySite(t, site("1s"), siteOptions{})
	base := goroutineBaseline(s)

	const n = 5
	resps := make(chan *response, n)
	for i := range n {
		go func() {
			r, err := s.send(context.Background(), "POST", "/pay", `{}`, "Idempotency-Key", fmt.Sprintf("inflight-%d", i))
			if err != nil {
				t.Error(err)
			}
			resps <- r
		}()
	}
	for range n {
		be.waitEntered(t, 10*time.Second)
	}
	s.caddyfile = strings.Replace(s.caddyfile, site("1s"), site("900ms"), 1)
	s.reload()
	// Three leases later every lock is still held through the old client.
	time.Sleep(3 * time.Second)
	for i := range n {
		r := s.do("POST", "/pay", `{}`, "Idempotency-Key", fmt.Sprintf("inflight-%d", i))
		if r.Status != http.StatusConflict {
			t.Errorf("duplicate of in-flight request %d after the reload: %d, want 409", i, r.Status)
		}
	}
	g.open()
	for range n {
		if r := <-resps; r == nil || r.Status != 200 {
			t.Errorf("in-flight request after the reload: %v", r)
		}
	}
	// Released, not expired: gone well within the 1s lease.
	redistest.Eventually(t, 500*time.Millisecond, "locks released after the reload", func() bool {
		return len(lockKeys(t, rdb, DefaultPrefix)) == 0
	})
	var inflight []string
	for i := range n {
		inflight = append(inflight, fmt.Sprintf("inflight-%d", i))
	}
	executions := be.executions(inflight...)
	if be.overlaps != 0 || executions != n {
		t.Fatalf("backend executions %d, overlaps %d; want %d and none", executions, be.overlaps, n)
	}
	// Back to the first settings: the retired client has been closed, so
	// the process is back to one client's goroutines.
	s.caddyfile = strings.Replace(s.caddyfile, site("900ms"), site("1s"), 1)
	s.reload()
	checkBaseline(t, s, base)
}
