package engine

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

// The classic scenario: A's lease expires, B acquires, A releases late. B
// must still hold its lock.
func TestReleaseAfterTakeoverLeavesNewHolder(t *testing.T) {
	_, rdb := startRedis(t)
	ctx := ctxT(t)
	c := New(rdb, nil)
	key := testKey(t)

	a, err := c.Acquire(ctx, key, Options{TTL: 300 * time.Millisecond, Renew: NoRenew})
	if err != nil {
		t.Fatal(err)
	}
	if !waitDone(t, a.Context(), 5*time.Second) {
		t.Fatal("A's context not done after its lease")
	}
	if cause := context.Cause(a.Context()); !errors.Is(cause, ErrLeaseExpired) {
		t.Fatalf("A's context cause = %v, want ErrLeaseExpired", cause)
	}
	// The local deadline comes before Redis's expiry; wait for the latter.
	redistest.Eventually(t, 5*time.Second, "A's key expired in Redis", func() bool {
		return rdb.Exists(ctx, key).Val() == 0
	})
	b := mustAcquire(t, c, key, Options{TTL: time.Minute})
	if b.Fence() <= a.Fence() {
		t.Fatalf("B's fence %d not above A's %d", b.Fence(), a.Fence())
	}

	if err := a.Release(ctx); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("A.Release after takeover = %v, want ErrNotHeld", err)
	}
	if got := holderOf(t, rdb, key); got != b.Token() {
		t.Fatalf("after A's late release the holder is %q, want B's token %q", got, b.Token())
	}
	if b.Context().Err() != nil {
		t.Fatal("B's context ended by A's release")
	}
	if err := b.Release(ctx); err != nil {
		t.Fatalf("B.Release: %v", err)
	}
}

func TestReleaseIsTokenChecked(t *testing.T) {
	_, rdb := startRedis(t)
	ctx := ctxT(t)
	key := testKey(t)
	l := mustAcquire(t, New(rdb, nil), key, Options{TTL: time.Minute, Renew: NoRenew})
	// Someone else's lock under the key (e.g. after expiry and takeover).
	holdAs(t, rdb, key, "someone-else", time.Minute)
	if err := l.Release(ctx); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Release = %v, want ErrNotHeld", err)
	}
	if got := holderOf(t, rdb, key); got != "someone-else" {
		t.Fatalf("Release deleted another holder's lock: holder %q", got)
	}
}

func TestReleaseIsIdempotent(t *testing.T) {
	_, rdb := startRedis(t)
	ctx := ctxT(t)
	key := testKey(t)
	l := mustAcquire(t, New(rdb, nil), key, Options{TTL: time.Minute})
	if err := l.Release(ctx); err != nil {
		t.Fatalf("first Release: %v", err)
	}
	if n := rdb.Exists(ctx, key).Val(); n != 0 {
		t.Fatal("key still present after Release")
	}
	if !waitDone(t, l.Context(), time.Second) {
		t.Fatal("context not done after Release")
	}
	if cause := context.Cause(l.Context()); !errors.Is(cause, ErrReleased) {
		t.Fatalf("cause = %v, want ErrReleased", cause)
	}
	for range 2 {
		if err := l.Release(ctx); !errors.Is(err, ErrNotHeld) {
			t.Fatalf("second Release = %v, want ErrNotHeld", err)
		}
	}
	if cause := context.Cause(l.Context()); !errors.Is(cause, ErrReleased) {
		t.Fatalf("cause after repeated Release = %v, want still ErrReleased", cause)
	}
	// Released locks cannot be refreshed.
	if err := l.Refresh(ctx, time.Minute); err == nil {
		t.Fatal("Refresh after Release succeeded")
	}
	if n := rdb.Exists(ctx, key).Val(); n != 0 {
		t.Fatal("Refresh after Release re-created the key")
	}
}

// The caller may be gone when it releases: Release is detached from ctx's
// cancellation.
func TestReleaseWithCancelledContext(t *testing.T) {
	_, rdb := startRedis(t)
	key := testKey(t)
	acqCtx, cancelAcq := context.WithCancel(context.Background())
	defer cancelAcq()
	l, err := New(rdb, nil).Acquire(acqCtx, key, Options{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	cancelAcq() // the request ended; its lock context ends with it
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release with a cancelled context = %v, want nil", err)
	}
	if n := rdb.Exists(ctxT(t), key).Val(); n != 0 {
		t.Fatal("lock still in Redis after Release with a cancelled context")
	}
	// Also with a context whose deadline has passed.
	l2 := mustAcquire(t, New(rdb, nil), key, Options{TTL: time.Minute})
	dctx, dcancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer dcancel()
	if err := l2.Release(dctx); err != nil {
		t.Fatalf("Release with an expired context = %v, want nil", err)
	}
	if n := rdb.Exists(ctxT(t), key).Val(); n != 0 {
		t.Fatal("lock still in Redis after Release with an expired context")
	}
}

func TestRefreshExtendsLease(t *testing.T) {
	_, rdb := startRedis(t)
	ctx := ctxT(t)
	key := testKey(t)
	l := mustAcquire(t, New(rdb, nil), key, Options{TTL: 2 * time.Second, Renew: NoRenew})
	before := l.Deadline()
	if typ := rdb.Type(ctx, key).Val(); typ != "hash" {
		t.Fatalf("TYPE = %q, want hash", typ)
	}
	p0 := rdb.PTTL(ctx, key).Val()
	if p0 <= 0 || p0 > 2*time.Second {
		t.Fatalf("PTTL before Refresh = %v", p0)
	}
	sent := time.Now()
	if err := l.Refresh(ctx, time.Minute); err != nil {
		t.Fatalf("Refresh: %v", err)
	}
	after := time.Now()
	if p := rdb.PTTL(ctx, key).Val(); p <= 50*time.Second {
		t.Fatalf("PTTL after Refresh(1m) = %v, want about 1m", p)
	}
	if typ := rdb.Type(ctx, key).Val(); typ != "hash" {
		t.Fatalf("TYPE after Refresh = %q, want hash", typ)
	}
	if got := holderOf(t, rdb, key); got != l.Token() {
		t.Fatalf("Refresh changed the value to %q", got)
	}
	// The local deadline moves to sent + ttl - margin.
	d := l.Deadline()
	lo := sent.Add(time.Minute - leaseMargin(time.Minute))
	hi := after.Add(time.Minute - leaseMargin(time.Minute))
	if !d.After(before) || d.Before(lo) || d.After(hi) {
		t.Fatalf("Deadline after Refresh = %v, want in [%v, %v]", d, lo, hi)
	}
	// ttl <= 0 means the acquire TTL.
	if err := l.Refresh(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if p := rdb.PTTL(ctx, key).Val(); p <= 0 || p > 2*time.Second {
		t.Fatalf("PTTL after Refresh(0) = %v, want the acquire TTL of 2s", p)
	}
	// Still held past the original 2s lease, since Refresh moved the
	// deadline the no-renew timer follows.
	if l.Context().Err() != nil {
		t.Fatal("context ended after Refresh")
	}
}

func TestRefreshAfterTakeoverIsNotHeld(t *testing.T) {
	_, rdb := startRedis(t)
	ctx := ctxT(t)
	key := testKey(t)
	l := mustAcquire(t, New(rdb, nil), key, Options{TTL: time.Minute, Renew: NoRenew})
	holdAs(t, rdb, key, "other", 10*time.Second)
	if err := l.Refresh(ctx, time.Minute); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Refresh after takeover = %v, want ErrNotHeld", err)
	}
	if p := rdb.PTTL(ctx, key).Val(); p > 10*time.Second {
		t.Fatalf("Refresh extended another holder's lease: PTTL %v", p)
	}
	if !waitDone(t, l.Context(), time.Second) {
		t.Fatal("context not cancelled after Refresh found the lock gone")
	}
	if cause := context.Cause(l.Context()); !errors.Is(cause, ErrNotHeld) || errors.Is(cause, ErrLeaseExpired) {
		t.Fatalf("cause = %v, want ErrNotHeld", cause)
	}
	// After the key is gone entirely, too.
	l2 := mustAcquire(t, New(rdb, nil), key+"2", Options{TTL: time.Minute, Renew: NoRenew})
	rdb.Del(ctx, key+"2")
	if err := l2.Refresh(ctx, time.Minute); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Refresh of a deleted lock = %v, want ErrNotHeld", err)
	}
	if rdb.Exists(ctx, key+"2").Val() != 0 {
		t.Fatal("Refresh re-created a deleted lock")
	}
}

// Refresh to a shorter lease: Redis expires the key sooner, so the local
// deadline (and the context) must follow it down, not keep the old lease.
func TestRefreshShorterLeaseMovesDeadlineEarlier(t *testing.T) {
	_, rdb := startRedis(t)
	ctx := ctxT(t)
	key := testKey(t)
	l := mustAcquire(t, New(rdb, nil), key, Options{TTL: time.Minute, Renew: NoRenew})
	const short = 300 * time.Millisecond
	if err := l.Refresh(ctx, short); err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	if d := l.Deadline(); d.After(after.Add(short)) {
		t.Fatalf("Deadline %v after Refresh(%v) at %v: the local lease outlives Redis's", d, short, after)
	}
	if !waitDone(t, l.Context(), 3*time.Second) {
		t.Fatal("context live long after the shortened lease")
	}
	if cause := context.Cause(l.Context()); !errors.Is(cause, ErrLeaseExpired) {
		t.Fatalf("cause = %v, want ErrLeaseExpired", cause)
	}
}

// Refresh to a longer lease on a renewing lock: the keep-alive keeps that
// lease, and the local deadline never runs past Redis's expiry.
func TestRefreshLongerLeaseWithKeepAlive(t *testing.T) {
	_, rdb := startRedis(t)
	ctx := ctxT(t)
	var renewals atomic.Int64
	c := New(rdb, &Config{OnRenew: func(err error) {
		if err == nil {
			renewals.Add(1)
		}
	}})
	key := testKey(t)
	l := mustAcquire(t, c, key, Options{TTL: 300 * time.Millisecond})
	if err := l.Refresh(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	n := renewals.Load()
	redistest.Eventually(t, 5*time.Second, "two renewals after Refresh", func() bool { return renewals.Load() >= n+2 })
	pttl := rdb.PTTL(ctx, key).Val()
	left := time.Until(l.Deadline())
	if left > pttl+200*time.Millisecond {
		t.Fatalf("local lease %v left, Redis PTTL %v: the context would outlive the key", left, pttl)
	}
	if pttl < 50*time.Second {
		t.Fatalf("PTTL %v after renewals: the keep-alive dropped the 1m lease Refresh asked for", pttl)
	}
	if l.Context().Err() != nil {
		t.Fatal(context.Cause(l.Context()))
	}
}
