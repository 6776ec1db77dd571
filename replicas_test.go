package redislock

// `replicas <n>`: a lock, and in idempotency mode an answer, counts once n
// replicas acknowledged it (WAIT), tested against a real master and
// replica, and a real Sentinel failover with the replica behind.

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/caddy-redis-lock/internal/redistest"
	"github.com/reqlock/caddy-redis-lock/record"
)

// With its replica paused, a site that waits for one answers 503 within
// twice the redis timeout and nothing reaches the backend; the lock is
// given back. Running, the replica has the answer by the time the client
// does. An answer whose acknowledgement does not come is still sent.
func TestReplicasAcknowledge(t *testing.T) {
	t.Parallel()
	t.Run("standalone", func(t *testing.T) {
		master, replica := redistest.StartWithReplica(t)
		replicasAcknowledge(t, master, replica, []string{"address " + master.Addr})
	})
	t.Run("sentinel", func(t *testing.T) {
		s := redistest.StartSentinel(t)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		masterAddr, err := s.MasterAddr(ctx)
		if err != nil {
			t.Fatal(err)
		}
		replicasAcknowledge(t, s.Node(masterAddr), s.Replica(masterAddr),
			[]string{"mode sentinel", "master_name " + s.MasterName(), "address " + strings.Join(s.SentinelAddrs(), " ")})
	})
}

// replicasAcknowledge is TestReplicasAcknowledge on a master and its
// replica, which the site's redis block (redis) reaches.
func replicasAcknowledge(t *testing.T, master, replica *redistest.Server, redisBlock []string) {
	var pauseInBackend atomic.Bool
	backend := newRecorder(t, func(w http.ResponseWriter, r *http.Request, s seen) {
		if pauseInBackend.Load() {
			if err := replica.Pause(); err != nil {
				t.Error(err)
			}
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"charged":%q}`, s.Key)
	})
	site := startCaddySite(t, paySite("", backend.URL, faultTimeouts, redisLines(append(redisBlock, "replicas 1")...), idempotent()), siteOptions{admin: true})
	mrdb := redis.NewClient(&redis.Options{Addr: master.Addr})
	rrdb := redis.NewClient(&redis.Options{Addr: replica.Addr})
	t.Cleanup(func() { mrdb.Close(); rrdb.Close() })
	ctx := context.Background()

	// The replica has the answer when the client has it.
	r := site.do("POST", "/pay", `{}`, "Idempotency-Key", "k1")
	if r.Status != 200 || r.Body != `{"charged":"k1"}` {
		t.Fatalf("first charge: %s", r)
	}
	if n, err := rrdb.Exists(ctx, record.Key(defaultKey("k1"))).Result(); err != nil || n != 1 {
		t.Fatalf("the replica lacks the answer the client got: exists %d, %v", n, err)
	}

	// The replica paused: 503 within 2x timeout, nothing upstream, the
	// lock given back.
	if err := replica.Pause(); err != nil {
		t.Fatal(err)
	}
	before := counterValue(t, metrics.unacked.by[writeLock])
	for _, key := range []string{"k2", "k3"} {
		start := time.Now()
		r := site.do("POST", "/pay", `{}`, "Idempotency-Key", key)
		took := time.Since(start)
		expectProblem(t, r, http.StatusServiceUnavailable)
		if took > 2*redisTimeout+slack {
			t.Errorf("%s: 503 after %v, want within 2x timeout (%v)", key, took, 2*redisTimeout)
		}
		if n := backend.executions(key); n != 0 {
			t.Errorf("%s reached the backend %d times with its lock unacknowledged", key, n)
		}
		redistest.Eventually(t, 5*time.Second, key+"'s lock given back", func() bool {
			return !keyExists(t, mrdb, defaultKey(key))
		})
	}
	if got := counterValue(t, metrics.unacked.by[writeLock]); got < before+2 {
		t.Errorf("replication_misses_total{write=lock} %v -> %v, want +2", before, got)
	}
	// The admin API's removal says that the replicas did not acknowledge it.
	var removed map[string]any
	if r := site.admin("DELETE", "/redis_lock/keys", keyQuery("key", "k1"), &removed); r.Status != 200 || removed["replicated"] != false {
		t.Errorf("DELETE with the replica paused: %s, want 200 with replicated false", r)
	}
	if err := replica.Resume(); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 10*time.Second, "the removal on the replica", func() bool {
		n, err := rrdb.Exists(ctx, record.Key(defaultKey("k1"))).Result()
		return err == nil && n == 0
	})
	redistest.Eventually(t, 10*time.Second, "requests pass again with the replica back", func() bool {
		return site.do("POST", "/pay", `{}`, "Idempotency-Key", "k2").Status == 200
	})

	// The replica pauses while the backend runs: the lock was acknowledged,
	// the answer is not; the client gets its answer all the same, and the
	// replica gets it once it is back.
	pauseInBackend.Store(true)
	before = counterValue(t, metrics.unacked.by[writeAnswer])
	start := time.Now()
	r = site.do("POST", "/pay", `{}`, "Idempotency-Key", "k4")
	took := time.Since(start)
	pauseInBackend.Store(false)
	if r.Status != 200 || r.Body != `{"charged":"k4"}` {
		t.Fatalf("charge whose answer is not acknowledged: %s", r)
	}
	if took > redisTimeout+slack {
		t.Errorf("the answer took %v, want within the redis timeout (%v)", took, redisTimeout)
	}
	if got := counterValue(t, metrics.unacked.by[writeAnswer]); got != before+1 {
		t.Errorf("replication_misses_total{write=answer} %v -> %v, want +1", before, got)
	}
	if r := site.do("POST", "/pay", `{}`, "Idempotency-Key", "k4"); r.Status != 200 || r.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry of k4: %s, want the stored answer replayed", r)
	}
	if err := replica.Resume(); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 10*time.Second, "the answer on the replica", func() bool {
		n, err := rrdb.Exists(ctx, record.Key(defaultKey("k4"))).Result()
		return err == nil && n == 1
	})
	if n := backend.executions("k4"); n != 1 {
		t.Errorf("k4 ran %d times, want 1", n)
	}
}

// Redlock's masters have no replicas: `replicas` is refused there, and a
// negative count anywhere.
func TestReplicasRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  RedisConfig
		want string
	}{
		{RedisConfig{Mode: ModeRedlock, Addresses: []string{"a:1", "b:1", "c:1"}, Replicas: 1}, "not for redlock"},
		{RedisConfig{Replicas: -1}, "must not be negative"},
	} {
		_, err := tc.cfg.resolve()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want one saying %q", tc.cfg, err, tc.want)
		}
	}
}

// A Sentinel failover whose new master missed the last writes: with
// `replicas 1` no key whose answer a client received runs again; without,
// some do, so the test can tell.
func TestReplicasFailover(t *testing.T) {
	t.Parallel()
	for _, replicas := range []int{0, 1} {
		t.Run(fmt.Sprintf("replicas %d", replicas), func(t *testing.T) {
			checkReran(t, replicas, failoverBehind(t, replicas, sentinelFailover(t)))
		})
	}
}

// The same in a Cluster of three masters with a replica each, one master
// killed.
func TestReplicasClusterFailover(t *testing.T) {
	t.Parallel()
	for _, replicas := range []int{0, 1} {
		t.Run(fmt.Sprintf("replicas %d", replicas), func(t *testing.T) {
			checkReran(t, replicas, failoverBehind(t, replicas, clusterFailover(t)))
		})
	}
}

func checkReran(t *testing.T, replicas, reran int) {
	t.Helper()
	switch {
	case replicas == 0 && reran == 0:
		t.Errorf("without replicas no answered key ran again after the failover: the test cannot tell")
	case replicas > 0 && reran > 0:
		t.Errorf("with replicas %d, %d answered keys ran again after the failover", replicas, reran)
	}
}

// failover is a topology whose master fails with its replica behind.
type failover struct {
	redis  []string                        // the site's redis block, but replicas
	behind func(ctx context.Context) error // cut the replica of the master that fails off
	fail   func(ctx context.Context) error // kill that master, resume its replica, wait for its promotion
	rejoin func(ctx context.Context) error // the old master back, as the new one's replica
}

// sentinelFailover is a master, a replica and three Sentinels.
func sentinelFailover(t *testing.T) failover {
	s := redistest.StartSentinel(t)
	var master string
	var replica *redistest.Server
	return failover{
		redis: []string{"mode sentinel", "master_name " + s.MasterName(), "address " + strings.Join(s.SentinelAddrs(), " ")},
		behind: func(ctx context.Context) error {
			var err error
			if master, err = s.MasterAddr(ctx); err != nil {
				return err
			}
			replica = s.Replica(master)
			return redistest.CutReplicas(ctx, master, replica)
		},
		fail: func(ctx context.Context) error {
			s.Node(master).Stop()
			if err := replica.Resume(); err != nil {
				return err
			}
			_, err := s.WaitStableWithout(ctx, master)
			return err
		},
		rejoin: func(ctx context.Context) error {
			if err := s.Node(master).Restart(); err != nil {
				return err
			}
			_, err := s.WaitStable(ctx)
			return err
		},
	}
}

// clusterFailover is a Cluster of three masters with a replica each.
func clusterFailover(t *testing.T) failover {
	c := redistest.StartCluster(t, 3, 1)
	var master string
	var replica *redistest.Server
	return failover{
		redis: []string{"mode cluster", "address " + strings.Join(c.MasterAddrs(), " ")},
		behind: func(ctx context.Context) error {
			master = c.MasterAddrs()[0]
			rs := c.ReplicasOf(master)
			if len(rs) != 1 {
				return fmt.Errorf("master %s has replicas %v, want one", master, rs)
			}
			replica = c.Node(rs[0])
			return redistest.CutReplicas(ctx, master, replica)
		},
		fail: func(ctx context.Context) error {
			if err := c.KillMaster(master); err != nil {
				return err
			}
			if err := replica.Resume(); err != nil {
				return err
			}
			return c.WaitFailover(ctx, master)
		},
		rejoin: func(ctx context.Context) error {
			if err := c.Node(master).Restart(); err != nil {
				return err
			}
			return c.WaitHealthy(ctx)
		},
	}
}

// failoverBehind runs charges with fresh keys through topo with `replicas`
// set, puts a replica behind under that load, fails its master over to it,
// brings the old master back as a replica, then retries every key whose
// client got a 200 and returns how many ran a second time.
func failoverBehind(t *testing.T, replicas int, topo failover) int {
	backend := newRecorder(t, func(w http.ResponseWriter, r *http.Request, s seen) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"charged":%q}`, s.Key)
	})
	redisBlock := topo.redis
	if replicas > 0 {
		redisBlock = append(redisBlock, fmt.Sprintf("replicas %d", replicas))
	}
	site := startCaddySite(t, paySite("", backend.URL, faultTimeouts, redisLines(redisBlock...), idempotent()), siteOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()

	var (
		mu       sync.Mutex
		answered []string
		stop     atomic.Bool
		wg       sync.WaitGroup
		next     atomic.Int64
	)
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(answered)
	}
	for range 8 {
		wg.Go(func() {
			for !stop.Load() {
				key := fmt.Sprintf("f%d-%d", replicas, next.Add(1))
				r, err := site.send(ctx, "POST", "/pay", `{}`, "Idempotency-Key", key)
				if err == nil && r.Status == 200 {
					mu.Lock()
					answered = append(answered, key)
					mu.Unlock()
				}
			}
		})
	}
	time.Sleep(500 * time.Millisecond)
	beforeCut := count()
	if err := topo.behind(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	t.Logf("replicas %d: %d answered before the cut, %d while the replica was behind", replicas, beforeCut, count()-beforeCut)
	if err := topo.fail(ctx); err != nil {
		t.Fatal(err)
	}
	stop.Store(true)
	wg.Wait()
	// With `replicas 1`, the new master alone takes no lock.
	if err := topo.rejoin(ctx); err != nil {
		t.Fatal(err)
	}
	keys := answered
	if len(keys) < 50 {
		t.Fatalf("only %d charges answered before the failover", len(keys))
	}

	// Every answered key retried: a replay, or 409 while its answer is
	// written again on the new master; never a second run.
	reran := 0
	for _, key := range keys {
		redistest.Eventually(t, 20*time.Second, key+" answered again", func() bool {
			r, err := site.send(ctx, "POST", "/pay", `{}`, "Idempotency-Key", key)
			return err == nil && r.Status != http.StatusConflict && r.Status != http.StatusServiceUnavailable
		})
		if backend.executions(key) > 1 {
			reran++
		}
	}
	t.Logf("replicas %d: %d charges answered, %d ran again after the failover", replicas, len(keys), reran)
	return reran
}

// BenchmarkReplicas is one request at a time through Caddy to a master with
// one replica, in idempotency mode (a lock and an answer per request), with
// `replicas 0` and `replicas 1`: what waiting for the replica adds.
func BenchmarkReplicas(b *testing.B) {
	master, _ := redistest.StartWithReplica(b)
	backend := newRecorder(b, nil)
	for _, n := range []int{0, 1} {
		b.Run(fmt.Sprintf("replicas=%d", n), func(b *testing.B) {
			site := startCaddySite(b, paySite(master.Addr, backend.URL, redisLines(fmt.Sprintf("replicas %d", n)), idempotent()), siteOptions{})
			ctx := context.Background()
			b.ResetTimer()
			for i := range b.N {
				r, err := site.send(ctx, "POST", "/pay", `{}`, "Idempotency-Key", fmt.Sprintf("bench-%d-%d", n, i))
				if err != nil || r.Status != 200 {
					b.Fatalf("%v %v", r, err)
				}
			}
		})
	}
}
