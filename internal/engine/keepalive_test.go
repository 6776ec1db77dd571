package engine

import (
	"context"
	"errors"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

func TestKeepAliveHoldsPastTTL(t *testing.T) {
	_, rdb := startRedis(t)
	ctx := ctxT(t)
	var renewals atomic.Int64
	c := New(rdb, &Config{OnRenew: func(err error) {
		if err == nil {
			renewals.Add(1)
		}
	}})
	key := testKey(t)
	const ttl = 300 * time.Millisecond
	l := mustAcquire(t, c, key, Options{TTL: ttl})
	first := l.Deadline()
	end := time.Now().Add(1500 * time.Millisecond)
	for time.Now().Before(end) {
		if err := l.Context().Err(); err != nil {
			t.Fatalf("lost the lock while held: %v", context.Cause(l.Context()))
		}
		if p := rdb.PTTL(ctx, key).Val(); p <= 0 {
			t.Fatalf("PTTL = %v while held", p)
		}
		if got := holderOf(t, rdb, key); got != l.Token() {
			t.Fatalf("holder %q while held", got)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// 1.5s at a 100ms interval: far more than the 5 a 300ms lease needs.
	if n := renewals.Load(); n < 5 {
		t.Fatalf("%d renewals in 1.5s", n)
	}
	if !l.Deadline().After(first.Add(time.Second)) {
		t.Fatalf("deadline did not move with renewals: %v then %v", first, l.Deadline())
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release after 1.5s: %v", err)
	}
}

// A lock taken over in Redis is reported through its context.
func TestKeepAliveDetectsLostLock(t *testing.T) {
	for _, tc := range []struct {
		name  string
		steal func(ctx context.Context, c *Client, key string) error
	}{
		{"DEL", func(ctx context.Context, c *Client, key string) error {
			return c.Backend().(*Redis).conn.Client().Del(ctx, key).Err()
		}},
		{"overwrite", func(ctx context.Context, c *Client, key string) error {
			_, err := c.Backend().(*Redis).conn.Client().TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.Del(ctx, key)
				p.HSet(ctx, key, "thief", "1")
				return nil
			})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, rdb := startRedis(t)
			ctx := ctxT(t)
			var notHeld atomic.Int64
			c := New(rdb, &Config{OnRenew: func(err error) {
				if errors.Is(err, ErrNotHeld) {
					notHeld.Add(1)
				}
			}})
			key := testKey(t)
			const ttl, renew = 3 * time.Second, 100 * time.Millisecond
			l := mustAcquire(t, c, key, Options{TTL: ttl, Renew: renew})
			stolen := time.Now()
			if err := tc.steal(ctx, c, key); err != nil {
				t.Fatal(err)
			}
			// Within a couple of renew intervals, long before the 3s lease.
			if !waitDone(t, l.Context(), 2*time.Second) {
				t.Fatal("context not cancelled after the lock was taken away")
			}
			took := time.Since(stolen)
			if cause := context.Cause(l.Context()); !errors.Is(cause, ErrNotHeld) || errors.Is(cause, ErrLeaseExpired) {
				t.Fatalf("cause = %v, want ErrNotHeld (not the lease deadline)", cause)
			}
			if notHeld.Load() != 1 {
				t.Fatalf("OnRenew saw ErrNotHeld %d times, want 1", notHeld.Load())
			}
			t.Logf("lost lock noticed after %v (renew %v)", took, renew)
			if err := l.Release(ctx); !errors.Is(err, ErrNotHeld) {
				t.Fatalf("Release = %v, want ErrNotHeld", err)
			}
		})
	}
}

// A hung Redis (SIGSTOP): the lease deadline fires while the refresh is
// stuck, within about the TTL, not when Redis comes back.
func TestKeepAliveLeaseExpiresWhileRedisPaused(t *testing.T) {
	srv, rdb := startRedis(t)
	ctx := ctxT(t)
	var failures atomic.Int64
	c := New(rdb, &Config{OnRenew: func(err error) {
		if err != nil {
			failures.Add(1)
		}
	}})
	key := testKey(t)
	const ttl = 500 * time.Millisecond
	// Warm the connection and the script so Acquire is one quick call.
	mustAcquire(t, c, key+"-warm", Options{TTL: time.Minute}).Release(ctx)

	start := time.Now()
	l, err := c.Acquire(ctx, key, Options{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			if err := srv.Resume(); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(resume)

	// Redis stays stopped for ttl+2s, four times the lease.
	done := waitDone(t, l.Context(), ttl+2*time.Second)
	lostAt := time.Now()
	resume()
	if !done {
		t.Fatal("context still live after 4 leases of a paused Redis")
	}
	if cause := context.Cause(l.Context()); !errors.Is(cause, ErrLeaseExpired) {
		t.Fatalf("cause = %v, want ErrLeaseExpired", cause)
	}
	// Every successful refresh was sent before the pause, so the deadline is
	// at most paused+ttl-margin; allow 400ms for a busy machine.
	if d := lostAt.Sub(paused); d > ttl+400*time.Millisecond {
		t.Fatalf("lease loss noticed %v after the pause, want < ttl+400ms", d)
	}
	if !lostAt.After(l.Deadline().Add(-time.Millisecond)) {
		t.Fatalf("context ended at %v, before the deadline %v", lostAt, l.Deadline())
	}
	t.Logf("lost %v after Acquire was sent, %v after the pause (ttl %v)", lostAt.Sub(start), lostAt.Sub(paused), ttl)
	// The lease is gone in Redis as well once it answers again.
	redistest.Eventually(t, 5*time.Second, "key expired after Resume", func() bool {
		return rdb.Exists(ctx, key).Val() == 0
	})
}

func TestNoRenewExpiresAtDeadline(t *testing.T) {
	srv, _ := startRedis(t)
	hook := &redistest.Commands{}
	rdb := newRDB(t, srv.Addr, hook)
	ctx := ctxT(t)
	c := New(rdb, nil)
	key := testKey(t)
	const ttl = 300 * time.Millisecond
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	before := time.Now()
	l, err := c.Acquire(ctx, key, Options{TTL: ttl, Renew: NoRenew})
	if err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	hook.Take()
	// sent + ttl - (ttl/100 + 2ms), with sent between before and after.
	margin := ttl/100 + 2*time.Millisecond
	d := l.Deadline()
	if lo, hi := before.Add(ttl-margin), after.Add(ttl-margin); d.Before(lo) || d.After(hi) {
		t.Fatalf("Deadline = %v, want in [%v, %v]", d, lo, hi)
	}
	if !waitDone(t, l.Context(), ttl+2*time.Second) {
		t.Fatal("no-renew lock still live long after its lease")
	}
	if time.Now().Before(d) {
		t.Fatalf("context ended before the deadline %v", d)
	}
	if cause := context.Cause(l.Context()); !errors.Is(cause, ErrLeaseExpired) || !errors.Is(cause, ErrNotHeld) {
		t.Fatalf("cause = %v, want ErrLeaseExpired (which is ErrNotHeld)", cause)
	}
	if cmds, _ := hook.Take(); len(cmds) != 0 {
		t.Fatalf("a no-renew lock sent %v while held", cmds)
	}
}

// A lock whose deadline has already passed when it is built (a very slow
// acquire reply) is lost at once; its timer may fire before newLock returns.
func TestLockWithPassedDeadline(t *testing.T) {
	c := New(nil, nil)
	for i := range 200 {
		renew := NoRenew
		if i%2 == 1 {
			renew = time.Millisecond
		}
		l := newLock(context.Background(), c, c.Backend(), "k", "t", 1, 10*time.Millisecond, renew, time.Now().Add(-time.Second))
		if !waitDone(t, l.Context(), 5*time.Second) {
			t.Fatal("lock with a passed deadline is live")
		}
		if cause := context.Cause(l.Context()); !errors.Is(cause, ErrLeaseExpired) {
			t.Fatalf("cause = %v", cause)
		}
	}
}

// After Release the keep-alive sends nothing and reports nothing.
func TestKeepAliveStopsOnRelease(t *testing.T) {
	srv, _ := startRedis(t)
	hook := &redistest.Commands{}
	rdb := newRDB(t, srv.Addr, hook)
	ctx := ctxT(t)
	var renewals atomic.Int64
	c := New(rdb, &Config{OnRenew: func(error) { renewals.Add(1) }})
	key := testKey(t)
	const ttl, renew = 300 * time.Millisecond, 30 * time.Millisecond
	l := mustAcquire(t, c, key, Options{TTL: ttl, Renew: renew})
	redistest.Eventually(t, 5*time.Second, "3 renewals", func() bool { return renewals.Load() >= 3 })
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	n := renewals.Load()
	hook.Take()
	time.Sleep(10 * renew)
	if got := renewals.Load(); got != n {
		t.Fatalf("%d renewals after Release", got-n)
	}
	if cmds, _ := hook.Take(); len(cmds) != 0 {
		t.Fatalf("commands after Release: %v", cmds)
	}
	if rdb.Exists(ctx, key).Val() != 0 {
		t.Fatal("key re-created after Release")
	}
}

// lockGoroutines lists goroutines running this package's lock code.
func lockGoroutines() []string {
	var b strings.Builder
	_ = pprof.Lookup("goroutine").WriteTo(&b, 2)
	var out []string
	for g := range strings.SplitSeq(b.String(), "\n\n") {
		if strings.Contains(g, "lock.(*Lock)") || strings.Contains(g, "lock.(*Client)") {
			out = append(out, g)
		}
	}
	return out
}

// No goroutine outlives its lock: many locks held through renewals, then
// released, lost or abandoned by their caller's context, leave nothing.
func TestNoGoroutineOutlivesLock(t *testing.T) {
	_, rdb := startRedis(t)
	ctx := ctxT(t)
	c := New(rdb, nil)
	key := testKey(t)
	const workers, rounds = 8, 4
	const ttl, renew = 200 * time.Millisecond, 40 * time.Millisecond

	run := func() {
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				for r := range rounds {
					k := key + string(rune('a'+w))
					lctx, cancel := context.WithCancel(ctx)
					l, err := c.Acquire(lctx, k, Options{TTL: ttl, Renew: renew})
					if err != nil {
						t.Error(err)
						cancel()
						return
					}
					time.Sleep(3 * renew) // hold through renewals
					switch r % 3 {
					case 0: // released
					case 1: // lost in Redis first
						_ = rdb.Del(ctx, k).Err()
						waitDone(t, l.Context(), 2*time.Second)
					case 2: // the caller's context ends first
						cancel()
					}
					_ = l.Release(ctx)
					cancel()
				}
			})
		}
		wg.Wait()
	}
	run() // warm-up: connections in the pool
	runtime.GC()
	base := runtime.NumGoroutine()
	for range 3 {
		run()
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		n, left := runtime.NumGoroutine(), lockGoroutines()
		if n <= base && len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines, %d before; left in lock code:\n%s", n, base, strings.Join(left, "\n\n"))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// When the context given to Acquire ends, the lock's context ends with it
// and the keep-alive stops instead of retrying until the lease deadline.
func TestKeepAliveStopsWhenCallerContextEnds(t *testing.T) {
	srv, _ := startRedis(t)
	hook := &redistest.Commands{}
	rdb := newRDB(t, srv.Addr, hook)
	c := New(rdb, nil)
	key := testKey(t)
	actx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const renew = 50 * time.Millisecond
	l, err := c.Acquire(actx, key, Options{TTL: 5 * time.Second, Renew: renew})
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if !waitDone(t, l.Context(), time.Second) {
		t.Fatal("lock context live after the caller's context ended")
	}
	if cause := context.Cause(l.Context()); !errors.Is(cause, context.Canceled) {
		t.Fatalf("cause = %v, want the caller's context.Canceled", cause)
	}
	time.Sleep(2 * renew) // at most one tick may already be under way
	hook.Take()
	time.Sleep(10 * renew)
	if cmds, _ := hook.Take(); len(cmds) != 0 {
		t.Fatalf("keep-alive still running after the caller's context ended: %d commands", len(cmds))
	}
	// Release still frees the key.
	if err := l.Release(context.Background()); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if rdb.Exists(context.Background(), key).Val() != 0 {
		t.Fatal("key left after Release")
	}
}
