package redislock

// A Redis Cluster master killed under load, its replica promoted and the
// old master back as the new one's replica, with `replicas 1`: what a
// client sees depends on its request's deadline, not on go-redis's retry
// counts.

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

// The timeouts of the two routes of TestClusterFailoverDeadlines. An
// acquire is retried for twice its route's timeout: the long route's is
// past failoverBudget, the time this test gives the whole failover, the
// short route's far below the Cluster's node timeout.
const (
	failoverBudget = 60 * time.Second
	longTimeout    = failoverBudget/2 + 5*time.Second
	shortTimeout   = 250 * time.Millisecond
)

// Requests on the killed master's slots whose deadline covers the failover
// (the long route's) all succeed; the others (the short route's) succeed
// or get 503 once their deadline passed, none earlier. Nothing answered
// 503 reached the backend, and nothing ran twice. Before the Cluster's
// refusals and a failed master were retried until the call's deadline,
// both routes answered 503 within milliseconds through the failover:
// go-redis's own retries (MaxRetries 1, MaxRedirects 3), a CLUSTERDOWN,
// then a new master without its replica, were each the end of the request.
func TestClusterFailoverDeadlines(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 3, 1)
	victim := c.MasterAddrs()[0] // slots 0 to 5460
	backend := newRecorder(t, nil)
	site := startCaddySite(t, failoverSite(c, backend.URL), siteOptions{admin: true})
	client := &http.Client{Timeout: 2 * failoverBudget, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	t.Cleanup(client.CloseIdleConnections)
	retriesBefore := metricSum(t, site, "caddy_redis_lock_cluster_retries_total")
	ctx := redistest.Context(t, 3*failoverBudget)

	var (
		mu    sync.Mutex
		shots = map[string][]shot{}
		stop  atomic.Bool
		wg    sync.WaitGroup
		n     atomic.Int64
	)
	for _, route := range []string{"long", "short"} {
		for range 4 {
			wg.Go(func() {
				for !stop.Load() {
					key := victimKey(route, &n)
					s := shot{key: key, start: time.Now()}
					r, err := sendRequest(ctx, client, "POST", site.URL+"/"+route, `{}`, "Idempotency-Key", key)
					s.end = time.Now()
					if err != nil {
						t.Errorf("%s: %v", key, err)
						return
					}
					s.status, s.body = r.Status, r.Body
					mu.Lock()
					shots[route] = append(shots[route], s)
					mu.Unlock()
				}
			})
		}
	}
	time.Sleep(time.Second)
	killed := time.Now()
	fctx, cancel := context.WithTimeout(ctx, failoverBudget)
	defer cancel()
	if err := c.KillMaster(victim); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitFailover(fctx, victim); err != nil {
		t.Fatal(err)
	}
	promoted := time.Now()
	// The new master has no replica until the old one is back as its
	// replica: until then `replicas 1` takes no lock on its slots.
	if err := c.Node(victim).Restart(); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitHealthy(fctx); err != nil {
		t.Fatal(err)
	}
	healed := time.Now()
	time.Sleep(time.Second)
	stop.Store(true)
	wg.Wait()
	t.Logf("killed %s: promoted after %v, its replica back after %v", victim,
		promoted.Sub(killed).Round(time.Millisecond), healed.Sub(killed).Round(time.Millisecond))

	for route, ss := range shots {
		across, refused := 0, 0
		var slowest, firstRefusal time.Duration
		for _, s := range ss {
			took := s.end.Sub(s.start)
			if s.start.Before(healed) && s.end.After(killed) {
				across++
				slowest = max(slowest, took)
			}
			runs := backend.executions(s.key)
			switch {
			case s.status == http.StatusOK && runs == 1:
			case s.status == http.StatusServiceUnavailable && route == "short" && runs == 0 && took >= 2*shortTimeout:
				refused++
				if firstRefusal == 0 || took < firstRefusal {
					firstRefusal = took
				}
			default:
				t.Errorf("%s: %d after %v (%v after the kill), %d runs: %s",
					s.key, s.status, took.Round(time.Millisecond), s.start.Sub(killed).Round(time.Millisecond), runs, s.body)
			}
		}
		t.Logf("%s route: %d requests, %d during the failover (the slowest %v), %d answered 503 (the quickest after %v)",
			route, len(ss), across, slowest.Round(time.Millisecond), refused, firstRefusal.Round(time.Millisecond))
		if across == 0 {
			t.Errorf("%s route: no request ran during the failover", route)
		}
		if route == "short" && refused == 0 {
			t.Errorf("short route: no request got 503: its deadline was not shorter than the failover")
		}
	}
	if retries := metricSum(t, site, "caddy_redis_lock_cluster_retries_total"); retries <= retriesBefore {
		t.Errorf("cluster_retries_total %v -> %v: the failover does not show in the metrics", retriesBefore, retries)
	}
}

// failoverSite has a locked route per timeout, /long and /short, both on
// c with `replicas 1`, in lock mode.
func failoverSite(c *redistest.Cluster, backend string) string {
	var b strings.Builder
	for _, r := range []struct {
		name    string
		timeout time.Duration
	}{{"long", longTimeout}, {"short", shortTimeout}} {
		fmt.Fprintf(&b, `	redis_lock /%s* {http.request.header.Idempotency-Key} {
		redis {
			mode cluster
			address %s
			timeout %v
			replicas 1
		}
	}
`, r.name, strings.Join(c.MasterAddrs(), " "), r.timeout)
	}
	fmt.Fprintf(&b, "\treverse_proxy %s", backend)
	return b.String()
}

// victimKey is a fresh key of route whose lock is in the slots of the
// Cluster's first master (0 to 5460).
func victimKey(route string, n *atomic.Int64) string {
	for {
		key := fmt.Sprintf("%s-failover-%d", route, n.Add(1))
		if redistest.SlotOf(defaultKey(key)) < 16384/3 {
			return key
		}
	}
}
