package redislock

// A request that waits for a held key (`wait`) starts when the holder
// releases it, not at its next poll: through Caddy, in lock-only and in
// idempotency mode, where the waiter gets the replay.

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

// firstSlow is a backend that holds the first request of each key for d
// and answers any other at once.
func firstSlow(t testing.TB, d time.Duration) *recorder {
	var mu sync.Mutex
	seenKeys := map[string]bool{}
	return newRecorder(t, func(w http.ResponseWriter, r *http.Request, s seen) {
		mu.Lock()
		first := !seenKeys[s.Key]
		seenKeys[s.Key] = true
		mu.Unlock()
		if first {
			time.Sleep(d)
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"charged":%q}`, s.Key)
	})
}

// waitLags sends n pairs of requests with one key each, the second while
// the first is held upstream for hold, and returns by how much the second's
// answer came after the first's, sorted.
func waitLags(t testing.TB, site *caddySite, prefix string, n int, hold time.Duration) []time.Duration {
	var lags []time.Duration
	ctx := context.Background()
	for i := range n {
		key := fmt.Sprintf("%s-%d", prefix, i)
		first := make(chan time.Time, 1)
		go func() {
			r, err := site.send(ctx, "POST", "/pay", `{}`, "Idempotency-Key", key)
			if err != nil || r.Status != 200 {
				t.Errorf("holder %s: %v %v", key, r, err)
			}
			first <- time.Now()
		}()
		time.Sleep(hold / 3)
		r, err := site.send(ctx, "POST", "/pay", `{}`, "Idempotency-Key", key)
		if err != nil || r.Status != 200 {
			t.Fatalf("waiter %s: %v %v", key, r, err)
		}
		end := time.Now()
		lags = append(lags, end.Sub(<-first))
	}
	slices.Sort(lags)
	return lags
}

func TestWaitWokenThroughCaddy(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	backend := firstSlow(t, 260*time.Millisecond)
	sites := startCaddySites(t, siteOptions{},
		paySite(srv.Addr, backend.URL, lockLines("wait 3s")),
		paySite(srv.Addr, backend.URL, lockLines("wait 3s", "prefix idem:"), idempotent()))
	for i, mode := range []string{"lock", "idempotency"} {
		lags := waitLags(t, sites[i], mode, 7, 260*time.Millisecond)
		t.Logf("%s: the waiter's answer after the holder's: %v", mode, lags)
		// Polling, the waiter would start up to 244ms after the release,
		// about 120ms at the median (lock's TestWaitWokenByRelease).
		if p50 := lags[len(lags)/2]; p50 > 40*time.Millisecond {
			t.Errorf("%s: median %v from the holder's answer to the waiter's, want a wake-up, not a poll", mode, p50)
		}
	}
	for i := range 7 {
		if n := backend.executions(fmt.Sprintf("idempotency-%d", i)); n != 1 {
			t.Errorf("idempotency-%d ran %d times: the waiter must get the replay", i, n)
		}
		if n := backend.executions(fmt.Sprintf("lock-%d", i)); n != 2 {
			t.Errorf("lock-%d ran %d times, want 2: the lock serialises, it does not deduplicate", i, n)
		}
	}
}

// BenchmarkWakeAfterRelease prints, over b.N waits (run it with
// -benchtime=200x), the p50 and p99 of the time from the holder's answer to
// the waiter's, through Caddy, a holder held upstream for 60ms.
func BenchmarkWakeAfterRelease(b *testing.B) {
	for _, mode := range []string{"lock", "idempotency"} {
		b.Run(mode, func(b *testing.B) {
			srv := redistest.Start(b)
			backend := firstSlow(b, 60*time.Millisecond)
			opts := []siteOption{lockLines("wait 3s")}
			if mode == "idempotency" {
				opts = append(opts, idempotent())
			}
			site := startCaddySite(b, paySite(srv.Addr, backend.URL, opts...), siteOptions{})
			b.ResetTimer()
			lags := waitLags(b, site, mode, b.N, 60*time.Millisecond)
			b.StopTimer()
			b.ReportMetric(float64(lags[len(lags)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(lags[len(lags)*99/100].Microseconds())/1000, "p99-ms")
		})
	}
}
