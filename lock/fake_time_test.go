package lock

import (
	"errors"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// Fake-time tests: miniredis's FastForward moves Redis's TTL clock without
// waiting. They add to the real-Redis tests; they do not replace them.

func startMiniredis(t *testing.T) (*miniredis.Miniredis, *Client) {
	t.Helper()
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	return m, New(rdb, nil)
}

func TestFakeTimeLeaseExpiryLetsNextHolderIn(t *testing.T) {
	m, c := startMiniredis(t)
	ctx := ctxT(t)
	key := testKey(t)
	// Long local lease: only Redis's (fake) clock moves here.
	a := mustAcquire(t, c, key, Options{TTL: time.Minute, Renew: NoRenew})

	_, err := c.Acquire(ctx, key, Options{TTL: time.Minute})
	var ne *NotObtainedError
	if !errors.As(err, &ne) || ne.Remaining != time.Minute {
		t.Fatalf("contended Acquire = %v, want Remaining 1m exactly on a frozen clock", err)
	}
	m.FastForward(40 * time.Second)
	if _, err = c.Acquire(ctx, key, Options{TTL: time.Minute}); !errors.As(err, &ne) || ne.Remaining != 20*time.Second {
		t.Fatalf("after 40s: %v, want Remaining 20s", err)
	}

	m.FastForward(21 * time.Second)
	if m.Exists(key) {
		t.Fatal("lock key survived its TTL")
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
	if got, _ := m.HKeys(key); len(got) != 1 || got[0] != b.Token() {
		t.Fatalf("HKEYS = %q, want the new holder's token", got)
	}
}

// The counter outlives every lock: a year on, a lock's token is still
// above the last one, and nothing but the counter is left in Redis.
func TestFakeTimeFenceCounterOutlivesLocks(t *testing.T) {
	m, c := startMiniredis(t)
	ctx := ctxT(t)
	key := testKey(t)
	var last int64
	for i := range 3 {
		l, err := c.Acquire(ctx, key, Options{TTL: time.Minute, Renew: NoRenew})
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
		m.FastForward(365 * 24 * time.Hour)
		if keys := m.Keys(); len(keys) != 1 || keys[0] != CounterKey(key) {
			t.Fatalf("round %d: keys %v a year on, want only the counter", i, keys)
		}
	}
}

func TestFakeTimeRefreshOutlivesOriginalTTL(t *testing.T) {
	m, c := startMiniredis(t)
	ctx := ctxT(t)
	key := testKey(t)
	l := mustAcquire(t, c, key, Options{TTL: 10 * time.Second, Renew: NoRenew})
	m.FastForward(8 * time.Second)
	if err := l.Refresh(ctx, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	m.FastForward(8 * time.Second) // 16s after acquire, 8s after refresh
	if got, _ := m.HKeys(key); len(got) != 1 || got[0] != l.Token() {
		t.Fatal("refreshed lock expired at its original TTL")
	}
	m.FastForward(3 * time.Second)
	if err := l.Refresh(ctx, 0); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Refresh after the lease = %v, want ErrNotHeld", err)
	}
}
