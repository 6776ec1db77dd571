package engine

import (
	"errors"
	"testing"
	"time"
)

// Redis's own clock ends a lease: these run on real time with short leases,
// the margins wide enough for a loaded machine.

func TestLeaseExpiryLetsNextHolderIn(t *testing.T) {
	_, rdb := startRedis(t)
	c := New(rdb, nil)
	ctx := ctxT(t)
	key := testKey(t)
	const ttl = 800 * time.Millisecond
	a := mustAcquire(t, c, key, Options{TTL: ttl, Renew: NoRenew})

	_, err := c.Acquire(ctx, key, Options{TTL: ttl})
	var ne *NotObtainedError
	if !errors.As(err, &ne) || ne.Remaining <= 0 || ne.Remaining > ttl {
		t.Fatalf("contended Acquire = %v, want Remaining in (0, %v]", err, ttl)
	}
	first := ne.Remaining
	time.Sleep(300 * time.Millisecond)
	if _, err = c.Acquire(ctx, key, Options{TTL: ttl}); !errors.As(err, &ne) || ne.Remaining > first-250*time.Millisecond {
		t.Fatalf("300ms on: %v, want Remaining at most %v", err, first-250*time.Millisecond)
	}

	time.Sleep(ttl) // past the lease on Redis's clock
	if n, err := rdb.Exists(ctx, key).Result(); err != nil || n != 0 {
		t.Fatalf("EXISTS lock key = %d, %v: it survived its TTL", n, err)
	}
	b, err := c.Acquire(ctx, key, Options{TTL: time.Minute, Renew: NoRenew})
	if err != nil {
		t.Fatalf("Acquire after the lease passed: %v", err)
	}
	defer b.Release(ctx)
	if b.Fence() <= a.Fence() {
		t.Fatalf("fence %d after %d", b.Fence(), a.Fence())
	}
	if err := a.Release(ctx); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("late release of the old holder = %v, want ErrNotHeld", err)
	}
	if got := rdb.HKeys(ctx, key).Val(); len(got) != 1 || got[0] != b.Token() {
		t.Fatalf("HKEYS = %q, want the new holder's token", got)
	}
}

// The counter outlives every lock: after each lock is released and its
// lease has passed, a lock's token is still above the last one, and
// nothing but the counter is left in Redis.
func TestFenceCounterOutlivesLocks(t *testing.T) {
	_, rdb := startRedis(t)
	c := New(rdb, nil)
	ctx := ctxT(t)
	key := testKey(t)
	const ttl = 200 * time.Millisecond
	var last int64
	for i := range 3 {
		l, err := c.Acquire(ctx, key, Options{TTL: ttl, Renew: NoRenew})
		if err != nil {
			t.Fatal(err)
		}
		if l.Fence() <= last {
			t.Fatalf("round %d: fence %d after %d", i, l.Fence(), last)
		}
		last = l.Fence()
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(ttl + 100*time.Millisecond)
		if keys := rdb.Keys(ctx, "*").Val(); len(keys) != 1 || keys[0] != CounterKey(key) {
			t.Fatalf("round %d: keys %v after the lease, want only the counter", i, keys)
		}
		if pttl := rdb.PTTL(ctx, CounterKey(key)).Val(); pttl != -1 {
			t.Fatalf("round %d: the counter's PTTL is %v, want none", i, pttl)
		}
	}
}

func TestRefreshOutlivesOriginalTTL(t *testing.T) {
	_, rdb := startRedis(t)
	c := New(rdb, nil)
	ctx := ctxT(t)
	key := testKey(t)
	const ttl = time.Second
	l := mustAcquire(t, c, key, Options{TTL: ttl, Renew: NoRenew})
	time.Sleep(700 * time.Millisecond)
	if err := l.Refresh(ctx, ttl); err != nil {
		t.Fatal(err)
	}
	time.Sleep(700 * time.Millisecond) // 1.4s after acquire, 0.7s after refresh
	if got := rdb.HKeys(ctx, key).Val(); len(got) != 1 || got[0] != l.Token() {
		t.Fatal("refreshed lock expired at its original TTL")
	}
	time.Sleep(600 * time.Millisecond) // 1.3s after refresh
	if err := l.Refresh(ctx, 0); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Refresh after the lease = %v, want ErrNotHeld", err)
	}
}
