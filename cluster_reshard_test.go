package redislock

// A Redis Cluster slot migrated the way `redis-cli --cluster reshard` does
// it (SETSLOT IMPORTING/MIGRATING, MIGRATE ... KEYS in batches, SETSLOT
// NODE) while requests on its keys keep coming, in lock mode and in
// idempotency mode: the requests wait for the slot instead of being
// refused.

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
	"github.com/reqlock/caddy-redis-lock/record"
)

// reshardTimeout is the redis timeout of the resharded sites without a
// wait: an acquire or begin is retried for twice that (CallTimeout) while
// its slot migrates.
const reshardTimeout = 5 * time.Second

// TestClusterReshard migrates a busy slot (300 application keys besides
// the locks) in batches while duplicates of requests keyed in it run:
// no 5xx, no request runs twice or beside its duplicate, and in
// idempotency mode every retry after the migration is the stored answer.
// Before the Cluster's refusals were retried until the call's deadline,
// each migration answered tens of them 503 within milliseconds. With a
// timeout far shorter than the migration, a wait carries the requests
// through it instead.
func TestClusterReshard(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 3, 0)
	for _, rc := range []reshardCase{
		{mode: "lock", timeout: reshardTimeout, deadline: 2 * reshardTimeout},
		{mode: "idempotency", timeout: reshardTimeout, deadline: 2 * reshardTimeout},
		{mode: "lock", timeout: 200 * time.Millisecond, wait: 10 * time.Second, deadline: 10 * time.Second},
	} {
		name := rc.mode
		if rc.wait > 0 {
			name += "-wait"
		}
		t.Run(name, func(t *testing.T) { reshardUnderLoad(t, c, name, rc) })
	}
}

// reshardCase is a route whose slot a test migrates: its mode, timeout and
// wait, and so an acquire's deadline (twice the timeout, or the wait).
type reshardCase struct {
	mode          string
	timeout, wait time.Duration
	deadline      time.Duration
}

// shot is one request of a load and what it got.
type shot struct {
	key        string
	status     int
	body       string
	replayed   bool
	start, end time.Time
}

func reshardUnderLoad(t *testing.T, c *redistest.Cluster, name string, rc reshardCase) {
	ctx := redistest.Context(t, 3*time.Minute)
	mode := rc.mode
	keys, slot, tag := slotKeys(name+"-reshard", 60)
	src, err := c.MasterOfSlot(slot)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 300 {
		if _, err := redistest.Do(ctx, src, nil, "SET", fmt.Sprintf("app:%s:%d", tag, i), "application data"); err != nil {
			t.Fatal(err)
		}
	}
	var to string
	for _, m := range c.MasterAddrs() {
		if m != src {
			to = m
		}
	}

	backend := newRecorder(t, func(w http.ResponseWriter, r *http.Request, s seen) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"charged":%q}`, s.Key)
	})
	opts := []siteOption{redisLines("mode cluster", "address "+strings.Join(c.MasterAddrs(), " "), "timeout "+rc.timeout.String())}
	if mode == "idempotency" {
		opts = append(opts, idempotent())
	}
	if rc.wait > 0 {
		opts = append(opts, lockLines("wait "+rc.wait.String()))
	}
	site := startCaddySite(t, paySite("", backend.URL, opts...), siteOptions{admin: true})
	retriesBefore := metricSum(t, site, "caddy_redis_lock_cluster_retries_total")

	// Two workers send each key, about at once; the keys go round, so
	// that in idempotency mode the later rounds are replays.
	var (
		mu    sync.Mutex
		shots []shot
		next  atomic.Int64
		stop  atomic.Bool
		wg    sync.WaitGroup
	)
	const workers = 16
	for range workers {
		wg.Go(func() {
			for !stop.Load() {
				key := keys[int(next.Add(1)/2)%len(keys)]
				s := shot{key: key, start: time.Now()}
				r, err := site.send(ctx, "POST", "/pay", `{}`, "Idempotency-Key", key)
				s.end = time.Now()
				if err != nil {
					t.Errorf("%s: %v", key, err)
					return
				}
				s.status, s.body, s.replayed = r.Status, r.Body, r.Header.Get(replayedHeader) == "true"
				mu.Lock()
				shots = append(shots, s)
				mu.Unlock()
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	begun := time.Now()
	m, err := c.StartMigration(ctx, slot, to)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.MoveAll(ctx, 10, 20*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	split, err := m.Finish(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ended := time.Now()
	time.Sleep(300 * time.Millisecond)
	stop.Store(true)
	wg.Wait()

	// A request is retried until its deadline: a migration longer than
	// that may refuse requests, which this test does not judge.
	if split >= rc.deadline {
		t.Fatalf("the slot was split for %v, longer than a request's deadline (%v)", split, rc.deadline)
	}
	during, failed := 0, 0
	var slowest time.Duration
	for _, s := range shots {
		if s.start.Before(ended) && s.end.After(begun) {
			during++
			slowest = max(slowest, s.end.Sub(s.start))
		}
		if s.status >= 500 {
			failed++
			if failed <= 10 {
				t.Errorf("%s: %d after %v, %v after the migration began: %s",
					s.key, s.status, s.end.Sub(s.start).Round(time.Millisecond), s.start.Sub(begun).Round(time.Millisecond), s.body)
			}
		}
	}
	t.Logf("%s: slot %d (%s to %s) split for %v; %d requests, %d during the migration (the slowest %v), %d 5xx",
		name, slot, src, to, split.Round(time.Millisecond), len(shots), during, slowest.Round(time.Millisecond), failed)
	if during < workers {
		t.Errorf("only %d requests ran during the migration: the test cannot tell", during)
	}
	if retries := metricSum(t, site, "caddy_redis_lock_cluster_retries_total"); retries <= retriesBefore {
		t.Errorf("cluster_retries_total %v -> %v: the migration does not show in the metrics", retriesBefore, retries)
	}
	checkReshardAnswers(t, c, site, backend, keys, shots, mode)
}

// checkReshardAnswers checks what the requests of a reshard got and left:
// in lock mode, no key ran beside its duplicate and no lock is left; in
// idempotency mode, each key ran once, every 200 is its key's answer, and
// a retry now is the stored answer.
func checkReshardAnswers(t *testing.T, c *redistest.Cluster, site *caddySite, backend *recorder, keys []string, shots []shot, mode string) {
	t.Helper()
	for _, s := range shots {
		if s.status == http.StatusOK && s.body != fmt.Sprintf(`{"charged":%q}`, s.key) {
			t.Errorf("%s answered %q", s.key, s.body)
		}
	}
	ctx := redistest.Context(t, time.Minute)
	for _, key := range keys {
		owner, err := c.MasterForKey(ctx, defaultKey(key))
		if err != nil {
			t.Fatal(err)
		}
		// A release that Redis did not answer within the timeout leaves
		// the lock to its lease (the default ttl, 10s).
		redistest.Eventually(t, DefaultTTL+5*time.Second, key+"'s lock gone", func() bool {
			n, err := redistest.Do(ctx, owner, nil, "EXISTS", defaultKey(key))
			return err == nil && n == int64(0)
		})
		if mode == "lock" {
			continue
		}
		if n := backend.executions(key); n != 1 {
			t.Errorf("%s ran %d times", key, n)
		}
		r, err := site.send(ctx, "POST", "/pay", `{}`, "Idempotency-Key", key)
		if err != nil || r.Status != http.StatusOK || r.Header.Get(replayedHeader) != "true" || r.Body != fmt.Sprintf(`{"charged":%q}`, key) {
			t.Errorf("%s retried after the migration: %v %v, want its stored answer", key, r, err)
		}
		if rec := get(t, owner, record.Key(defaultKey(key))); !strings.HasPrefix(rec, "C") {
			t.Errorf("%s: record %.20q, want a completed one", key, rec)
		}
	}
	backend.mu.Lock()
	overlaps := backend.overlaps
	backend.mu.Unlock()
	if overlaps != 0 {
		t.Errorf("%d executions ran beside one of the same key", overlaps)
	}
}

// slotKeys are n request keys whose lock keys (and so their records and
// counters) all hash to one Cluster slot, found by trying names: that slot
// and the hash tag of its first key, for keys of one's own in the slot.
func slotKeys(prefix string, n int) (keys []string, slot int, tag string) {
	for i := 0; len(keys) < n; i++ {
		name := fmt.Sprintf("%s-%d", prefix, i)
		k := defaultKey(name)
		s := redistest.SlotOf(k)
		if keys == nil {
			slot, tag = s, k[strings.IndexByte(k, '{'):strings.IndexByte(k, '}')+1]
		}
		if s == slot {
			keys = append(keys, name)
		}
	}
	return keys, slot, tag
}

// metricSum is the sum of every series of the metric name on the site's
// admin API (siteOptions.admin).
func metricSum(t *testing.T, s *caddySite, name string) float64 {
	t.Helper()
	r, err := sendRequest(context.Background(), s.client, "GET", s.AdminURL+"/metrics", "")
	if err != nil || r.Status != 200 {
		t.Fatalf("GET /metrics: %v %v", err, r)
	}
	sum := 0.0
	for line := range strings.Lines(r.Body) {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || rest == "" || rest[0] != '{' && rest[0] != ' ' {
			continue
		}
		var v float64
		if _, err := fmt.Sscan(rest[strings.LastIndexByte(rest, ' ')+1:], &v); err == nil {
			sum += v
		}
	}
	return sum
}
