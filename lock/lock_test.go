package lock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

// Tests of the public API: what it passes to the lock engine
// (internal/engine), whose own tests cover the lock's behaviour.

// newRDB returns a go-redis client of a redis-server started for t, that
// honours context deadlines, as New's documentation asks.
func newRDB(t testing.TB) *redis.Client {
	t.Helper()
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, DialTimeout: time.Second})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// ctxT is a context for one test step, generous so a busy machine never
// trips it, cancelled when t ends.
func ctxT(t testing.TB) context.Context {
	return redistest.Context(t, 20*time.Second)
}

// mustAcquire acquires key or fails the test.
func mustAcquire(t testing.TB, c *Client, key string, opt Options) *Lock {
	t.Helper()
	l, err := c.Acquire(ctxT(t), key, opt)
	if err != nil {
		t.Fatalf("Acquire(%s): %v", key, err)
	}
	t.Cleanup(func() { _ = l.Release(context.Background()) })
	return l
}

// testKey is a lock key unique to t.
func testKey(t testing.TB) string {
	return Key("test:", "lock", t.Name())
}

// Client is a Locker: code written against the interface takes locks.
func TestClientIsLocker(t *testing.T) {
	rdb := newRDB(t)
	var lk Locker = New(rdb, nil)
	l, err := lk.Acquire(ctxT(t), testKey(t), Options{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctxT(t)); err != nil {
		t.Fatal(err)
	}
}

// A Lock through the public API: its lease is Options.TTL, a second caller
// is told for how long, Refresh moves the lease and the deadline, Wait
// waits for the release, and Release ends the context once.
func TestLockLifecycle(t *testing.T) {
	rdb := newRDB(t)
	c := New(rdb, &Config{CallTimeout: 5 * time.Second, ReleaseTimeout: 5 * time.Second})
	ctx := ctxT(t)
	key := testKey(t)
	l := mustAcquire(t, c, key, Options{TTL: 7 * time.Second, Renew: NoRenew})
	if l.Key() != key || l.Token() == "" || l.Fence() <= 0 {
		t.Fatalf("lock %q token %q fence %d", l.Key(), l.Token(), l.Fence())
	}
	if pttl := rdb.PTTL(ctx, key).Val(); pttl <= 6*time.Second || pttl > 7*time.Second {
		t.Fatalf("PTTL %v, want the 7s lease", pttl)
	}
	if left := time.Until(l.Deadline()); left <= 6*time.Second || left > 7*time.Second {
		t.Fatalf("local deadline in %v, want just under 7s", left)
	}

	_, err := c.Acquire(ctx, key, Options{TTL: 7 * time.Second})
	var ne *NotObtainedError
	if !errors.As(err, &ne) || !errors.Is(err, ErrNotObtained) || ne.Remaining <= 6*time.Second {
		t.Fatalf("second Acquire = %v, want ErrNotObtained with the holder's lease left", err)
	}

	if err := l.Refresh(ctx, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	if pttl := rdb.PTTL(ctx, key).Val(); pttl <= 19*time.Second {
		t.Fatalf("PTTL %v after Refresh(20s)", pttl)
	}
	if left := time.Until(l.Deadline()); left <= 19*time.Second {
		t.Fatalf("local deadline in %v after Refresh(20s)", left)
	}

	go func() {
		time.Sleep(50 * time.Millisecond)
		_ = l.Release(context.Background())
	}()
	next, err := c.Acquire(ctx, key, Options{TTL: 7 * time.Second, Wait: 10 * time.Second})
	if err != nil {
		t.Fatalf("Acquire with Wait after the release: %v", err)
	}
	if next.Fence() <= l.Fence() {
		t.Fatalf("fence %d after %d", next.Fence(), l.Fence())
	}
	if cause := context.Cause(l.Context()); !errors.Is(cause, ErrReleased) {
		t.Fatalf("released lock's context cause %v, want ErrReleased", cause)
	}
	if err := l.Release(ctx); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("second Release = %v, want ErrNotHeld", err)
	}
	if err := next.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// Config.CallTimeout bounds an acquire on a Redis that does not answer:
// ErrUnavailable, not the caller's deadline.
func TestCallTimeout(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	c := New(rdb, &Config{CallTimeout: 200 * time.Millisecond})
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Resume() })
	start := time.Now()
	_, err := c.Acquire(ctxT(t), testKey(t), Options{TTL: time.Minute})
	if took := time.Since(start); !errors.Is(err, ErrUnavailable) || took > 1500*time.Millisecond {
		t.Fatalf("Acquire on a paused Redis = %v after %v, want ErrUnavailable within the 200ms CallTimeout", err, took)
	}
}

// NewReplicatedRedis counts a lock once the replicas acknowledged it:
// without a replica, Acquire fails with ErrNotReplicated and ErrUnavailable.
func TestReplicatedRedisWithoutReplica(t *testing.T) {
	rdb := newRDB(t)
	c := NewWithBackend(NewReplicatedRedis(rdb, Replication{Replicas: 1, Timeout: 200 * time.Millisecond}), nil)
	_, err := c.Acquire(ctxT(t), testKey(t), Options{TTL: time.Minute})
	if !errors.Is(err, ErrNotReplicated) || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Acquire with no replica: %v, want ErrNotReplicated and ErrUnavailable", err)
	}
}

// A Redlock takes the lock on every master that answers and releases it on
// all; an even number of masters is refused.
func TestRedlock(t *testing.T) {
	var clients []redis.UniversalClient
	var rdbs []*redis.Client
	var names []string
	for range 3 {
		rdb := newRDB(t)
		clients, rdbs, names = append(clients, rdb), append(rdbs, rdb), append(names, rdb.Options().Addr)
	}
	if _, err := NewRedlock(clients[:2], names[:2]); err == nil {
		t.Fatal("NewRedlock of 2 masters: no error")
	}
	rl, err := NewRedlock(clients, names)
	if err != nil {
		t.Fatal(err)
	}
	c := NewWithBackend(rl, &Config{CallTimeout: 5 * time.Second})
	ctx := ctxT(t)
	key := testKey(t)
	l := mustAcquire(t, c, key, Options{TTL: time.Minute})
	redistest.Eventually(t, 5*time.Second, "the lock on every master", func() bool {
		for _, rdb := range rdbs {
			if !rdb.HExists(ctx, key, l.Token()).Val() {
				return false
			}
		}
		return true
	})
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 5*time.Second, "the lock released on every master", func() bool {
		for _, rdb := range rdbs {
			if rdb.Exists(ctx, key).Val() != 0 {
				return false
			}
		}
		return true
	})
}
