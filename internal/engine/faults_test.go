package engine

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

// asyncRDB is go-redis's deferred autopipeliner over a client that retries
// once.
func asyncRDB(t testing.TB, addr string) redis.UniversalClient {
	t.Helper()
	ap, _ := asyncPair(t, addr)
	return ap
}

// asyncPair is asyncRDB and the client under it.
func asyncPair(t testing.TB, addr string) (ap redis.UniversalClient, base *redis.Client) {
	t.Helper()
	base = redis.NewClient(&redis.Options{
		Addr: addr, ContextTimeoutEnabled: true, MaxRetries: 1, DialerRetries: 1,
		DialTimeout: 300 * time.Millisecond, ReadTimeout: 300 * time.Millisecond, WriteTimeout: 300 * time.Millisecond,
	})
	a, err := base.AsyncAutoPipeline()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close(); _ = base.Close() })
	return a, base
}

// pipelinedRedis is the Caddy handler's backend: the deferred autopipeliner,
// and lone calls on the client under it.
func pipelinedRedis(t testing.TB, addr string) *Redis {
	t.Helper()
	ap, base := asyncPair(t, addr)
	return NewPipelinedRedis(ap, base, Replication{})
}

// A paused Redis (SIGSTOP) answers nothing. With the deferred autopipeliner
// every acquire, also of many concurrent callers whose commands queue
// behind each other, gives up at CallTimeout, and so does a release at
// ReleaseTimeout.
func TestCallTimeoutBoundsQueuedCalls(t *testing.T) {
	backends := map[string]func(t *testing.T, addr string) *Redis{
		"autopipeliner": func(t *testing.T, addr string) *Redis { return NewRedis(asyncRDB(t, addr)) },
		// The first acquire goes on the client: nothing else is in flight.
		"autopipeliner and lone calls": func(t *testing.T, addr string) *Redis { return pipelinedRedis(t, addr) },
	}
	for name, backend := range backends {
		t.Run(name, func(t *testing.T) { testCallTimeoutBoundsQueuedCalls(t, backend) })
	}
}

func testCallTimeoutBoundsQueuedCalls(t *testing.T, backend func(t *testing.T, addr string) *Redis) {
	srv, _ := startRedis(t)
	const callTimeout = 600 * time.Millisecond
	c := NewWithBackend(backend(t, srv.Addr), &Config{CallTimeout: callTimeout})
	if !c.Backend().(*Redis).conn.Deferred() {
		t.Fatal("the deferred autopipeliner was not recognised")
	}
	held := mustAcquire(t, c, testKey(t)+"-held", Options{TTL: time.Minute, Renew: NoRenew})
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Resume() })

	const n = 50
	var wg sync.WaitGroup
	took := make([]time.Duration, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			_, errs[i] = c.Acquire(context.Background(), fmt.Sprintf("%s-%d", testKey(t), i), Options{TTL: time.Minute})
			took[i] = time.Since(start)
		}()
	}
	wg.Wait()
	for i := range n {
		if !errors.Is(errs[i], ErrUnavailable) {
			t.Errorf("acquire %d on a paused Redis: %v, want ErrUnavailable", i, errs[i])
		}
		if took[i] > callTimeout+300*time.Millisecond {
			t.Errorf("acquire %d took %v, want about the %v CallTimeout", i, took[i], callTimeout)
		}
	}
	start := time.Now()
	err := held.Release(context.Background())
	checkUnavailable(t, "Release on a paused Redis", err)
	if d := time.Since(start); d > callTimeout+300*time.Millisecond {
		t.Errorf("Release took %v, want about the %v ReleaseTimeout (defaults to CallTimeout)", d, callTimeout)
	}
}

// Acquires that fail leave a give-back behind each (the script may have
// run), never more than MaxBackground tried at once, nor more than 64
// whatever MaxBackground says, and they leave the other background work
// its own room. Those beyond wait their turn rather than being dropped:
// the acquires that waited in the paused Redis's socket buffer run when it
// resumes, and every one is given back, none left holding its key for the
// lease.
func TestBackgroundReleasesAreBounded(t *testing.T) {
	for _, tc := range []struct {
		maxBackground, acquires int
		peak                    int64
	}{
		{maxBackground: 4, acquires: 40, peak: 4},
		{maxBackground: 1024, acquires: 100, peak: maxGiveBackWorkers},
	} {
		t.Run(fmt.Sprintf("MaxBackground %d", tc.maxBackground), func(t *testing.T) {
			backgroundReleasesBounded(t, tc.maxBackground, tc.acquires, tc.peak)
		})
	}
}

func backgroundReleasesBounded(t *testing.T, maxBackground, acquires int, wantPeak int64) {
	srv, rdb := startRedis(t)
	c := New(asyncRDB(t, srv.Addr), &Config{CallTimeout: 200 * time.Millisecond, MaxBackground: maxBackground})
	mustAcquire(t, c, testKey(t)+"-warm", Options{TTL: time.Minute, Renew: NoRenew})
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Resume() })
	var peak atomic.Int64
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if n := int64(c.givingBackNow()); n > peak.Load() {
				peak.Store(n)
			}
			time.Sleep(time.Millisecond)
		}
	}()
	var wg sync.WaitGroup
	for i := range acquires {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = c.Acquire(context.Background(), fmt.Sprintf("%s-%d", testKey(t), i), Options{TTL: time.Minute})
		}()
	}
	wg.Wait()
	time.Sleep(100 * time.Millisecond) // the last ones are still waiting on Redis
	ran := make(chan struct{})
	if !c.Background(ctxT(t), func(context.Context) { close(ran) }) {
		t.Fatal("give-backs that Redis does not answer left no room for other background work")
	}
	<-ran
	_ = srv.Resume()
	redistest.Eventually(t, 5*time.Second, "background releases to end", func() bool { return c.Running() == 0 })
	close(stop)
	if p := peak.Load(); p != wantPeak {
		t.Fatalf("give-backs tried at once: peak %d, want %d", p, wantPeak)
	}
	ctx := ctxT(t)
	if marks := rdb.Keys(ctx, testKey(t)+"-*:gone:*").Val(); len(marks) != acquires {
		t.Errorf("%d tokens marked given back, want all %d", len(marks), acquires)
	}
	var held []string
	for i := range acquires {
		if k := fmt.Sprintf("%s-%d", testKey(t), i); rdb.Exists(ctx, k).Val() != 0 {
			held = append(held, k)
		}
	}
	if len(held) > 0 {
		t.Errorf("%d of %d keys still held after Redis resumed, by acquires nobody runs, not given back", len(held), acquires)
	}
}

// failOnce is a go-redis hook that fails the first command named name with
// a network-like error, without sending it.
type failOnce struct {
	name   string
	failed atomic.Bool
}

func (f *failOnce) DialHook(next redis.DialHook) redis.DialHook { return next }
func (f *failOnce) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (f *failOnce) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if strings.EqualFold(cmd.Name(), f.name) && refreshArgs(cmd) && f.failed.CompareAndSwap(false, true) {
			err := errors.New("injected: connection reset by peer")
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

// refreshArgs reports whether an EVALSHA/EVAL runs refresh.lua.
func refreshArgs(cmd redis.Cmder) bool {
	args := cmd.Args()
	return len(args) > 1 && (args[1] == refreshScript.SHA || args[1] == refreshScript.Src)
}

// One failed keep-alive refresh does not end the lock: the next renewal
// comes before the deadline, succeeds, and the lock's Context stays alive.
func TestOneFailedRefreshIsRetried(t *testing.T) {
	srv, _ := startRedis(t)
	hook := &failOnce{name: "evalsha"}
	var mu sync.Mutex
	var outcomes []error
	c := New(newRDB(t, srv.Addr, hook), &Config{OnRenew: func(err error) {
		mu.Lock()
		outcomes = append(outcomes, err)
		mu.Unlock()
	}})
	const ttl, renew = 900 * time.Millisecond, 300 * time.Millisecond
	l := mustAcquire(t, c, testKey(t), Options{TTL: ttl, Renew: renew})
	// Three leases: a lock that the one failure ended would be gone by then.
	if waitDone(t, l.Context(), 3*ttl) {
		t.Fatalf("lock lost after one failed refresh: %v", context.Cause(l.Context()))
	}
	mu.Lock()
	got := append([]error(nil), outcomes...)
	mu.Unlock()
	if !hook.failed.Load() || len(got) < 2 || got[0] == nil || !errors.Is(got[0], ErrUnavailable) {
		t.Fatalf("refresh outcomes %v: want the injected failure first", got)
	}
	if got[1] != nil {
		t.Fatalf("refresh outcomes %v: want the renewal after the failure to succeed", got)
	}
	if err := l.Release(ctxT(t)); err != nil {
		t.Fatalf("release after the retried refresh: %v", err)
	}
}

// A script is not a transaction: for a user who may not run PEXPIRE, the
// acquire must fail without leaving a lock that never expires.
func TestNoLockWithoutTTL(t *testing.T) {
	srv, admin := startRedis(t)
	ctx := ctxT(t)
	for _, rule := range [][]string{
		{"-pexpire"},
		{"-pexpire", "-hdel", "-del", "-unlink"},
	} {
		t.Run(strings.Join(rule, " "), func(t *testing.T) {
			args := []any{"acl", "setuser", "locker", "reset", "on", ">pw", "~*", "&*", "+@all"}
			for _, r := range rule {
				args = append(args, r)
			}
			if err := admin.Do(ctx, args...).Err(); err != nil {
				t.Fatal(err)
			}
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "locker", Password: "pw", ContextTimeoutEnabled: true})
			t.Cleanup(func() { _ = rdb.Close() })
			key := testKey(t)
			_, err := New(rdb, nil).Acquire(ctx, key, Options{TTL: time.Minute})
			if !errors.Is(err, ErrUnavailable) {
				t.Fatalf("Acquire without PEXPIRE = %v, want ErrUnavailable", err)
			}
			redistest.Eventually(t, 2*time.Second, "no lock key", func() bool {
				return admin.Exists(ctx, key).Val() == 0
			})
		})
	}
}

// ReleaseAsync returns at once on a hung Redis, ends the lock's Context, and
// the release happens when Redis answers again.
func TestReleaseAsyncDoesNotWait(t *testing.T) {
	srv, rdb := startRedis(t)
	c := New(newRDB(t, srv.Addr), &Config{ReleaseTimeout: 5 * time.Second})
	key := testKey(t)
	l := mustAcquire(t, c, key, Options{TTL: time.Minute, Renew: NoRenew})
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Resume() })
	released := make(chan error, 1)
	start := time.Now()
	l.ReleaseAsync(context.Background(), func(err error) { released <- err })
	if d := time.Since(start); d > 50*time.Millisecond {
		t.Fatalf("ReleaseAsync took %v on a paused Redis", d)
	}
	if !errors.Is(context.Cause(l.Context()), ErrReleased) {
		t.Fatalf("lock context cause %v, want ErrReleased", context.Cause(l.Context()))
	}
	time.Sleep(200 * time.Millisecond)
	_ = srv.Resume()
	select {
	case err := <-released:
		if err != nil {
			t.Fatalf("background release: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("background release never ended")
	}
	if n := rdb.Exists(ctxT(t), key).Val(); n != 0 {
		t.Fatal("lock still there after the background release")
	}
}

// After the faults above, no goroutine of this package is left running.
func TestNoGoroutineLeftAfterFaults(t *testing.T) {
	srv, _ := startRedis(t)
	c := New(asyncRDB(t, srv.Addr), &Config{CallTimeout: 200 * time.Millisecond})
	warm := mustAcquire(t, c, testKey(t)+"-warm", Options{TTL: time.Minute})
	if err := warm.Release(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	before := runtime.NumGoroutine()
	l := mustAcquire(t, c, testKey(t), Options{TTL: 2 * time.Second})
	_ = srv.Pause()
	for i := range 10 {
		_, _ = c.Acquire(context.Background(), fmt.Sprintf("%s-%d", testKey(t), i), Options{TTL: time.Minute})
	}
	l.ReleaseAsync(context.Background(), nil)
	_ = srv.Resume()
	redistest.Eventually(t, 10*time.Second, "background work to end", func() bool { return c.Running() == 0 })
	redistest.Eventually(t, 10*time.Second, fmt.Sprintf("goroutines back to %d", before), func() bool {
		return runtime.NumGoroutine() <= before
	})
}
