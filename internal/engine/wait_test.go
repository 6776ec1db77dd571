package engine

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

func TestWaitObtainsAfterRelease(t *testing.T) {
	_, rdb := startRedis(t)
	ctx := ctxT(t)
	c := New(rdb, nil)
	key := testKey(t)
	holder := mustAcquire(t, c, key, Options{TTL: time.Minute})
	var released atomic.Pointer[time.Time]
	go func() {
		time.Sleep(200 * time.Millisecond)
		now := time.Now()
		released.Store(&now)
		_ = holder.Release(context.Background())
	}()
	const wait = 10 * time.Second
	start := time.Now()
	l, err := c.Acquire(ctx, key, Options{TTL: time.Minute, Wait: wait})
	if err != nil {
		t.Fatalf("waiting Acquire: %v", err)
	}
	defer l.Release(ctx)
	got := time.Now()
	rel := released.Load()
	if rel == nil {
		t.Fatal("obtained before the holder released")
	}
	// Backoff is capped at 256ms: soon after the release, well before the
	// 10s wait ends.
	if d := got.Sub(*rel); d > 2*time.Second {
		t.Fatalf("obtained %v after the release", d)
	}
	if got.Sub(start) >= wait {
		t.Fatal("obtained only at the end of the wait")
	}
	if l.Fence() <= holder.Fence() {
		t.Fatalf("fence %d not above the holder's %d", l.Fence(), holder.Fence())
	}
}

func TestWaitObtainsAfterLeaseExpires(t *testing.T) {
	_, rdb := startRedis(t)
	ctx := ctxT(t)
	c := New(rdb, nil)
	key := testKey(t)
	const ttl = 400 * time.Millisecond
	// The holder neither renews nor releases (a crashed process).
	holder := mustAcquire(t, c, key, Options{TTL: ttl, Renew: NoRenew})
	start := time.Now()
	l, err := c.Acquire(ctx, key, Options{TTL: time.Minute, Wait: 10 * time.Second})
	if err != nil {
		t.Fatalf("waiting Acquire: %v", err)
	}
	defer l.Release(ctx)
	if d := time.Since(start); d > ttl+2*time.Second {
		t.Fatalf("obtained %v after the wait began, holder's lease was %v", d, ttl)
	}
	if l.Fence() <= holder.Fence() {
		t.Fatalf("fence %d not above the holder's %d", l.Fence(), holder.Fence())
	}
}

func TestNoWaitFailsAtOnce(t *testing.T) {
	srv, _ := startRedis(t)
	hook := &redistest.Commands{}
	c := New(newRDB(t, srv.Addr, hook), nil)
	ctx := ctxT(t)
	key := testKey(t)
	mustAcquire(t, c, key, Options{TTL: time.Minute})
	hook.Take()
	start := time.Now()
	_, err := c.Acquire(ctx, key, Options{TTL: time.Minute})
	if !errors.Is(err, ErrNotObtained) {
		t.Fatalf("Acquire without Wait = %v, want ErrNotObtained", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("Acquire without Wait took %v", d)
	}
	if cmds, _ := hook.Take(); len(cmds) != 1 {
		t.Fatalf("Acquire without Wait sent %v, want one attempt", cmds)
	}
}

// A bounded wait ends with ErrNotObtained (and the holder's remaining
// lease); its attempts back off exponentially instead of hammering Redis.
func TestWaitBoundedWithBackoff(t *testing.T) {
	srv, _ := startRedis(t)
	hook := &redistest.Commands{}
	c := New(newRDB(t, srv.Addr, hook), nil)
	ctx := ctxT(t)
	key := testKey(t)
	mustAcquire(t, c, key, Options{TTL: time.Minute})
	hook.Take()
	const wait = time.Second
	start := time.Now()
	_, err := c.Acquire(ctx, key, Options{TTL: time.Minute, Wait: wait})
	took := time.Since(start)
	var ne *NotObtainedError
	if !errors.As(err, &ne) {
		t.Fatalf("Acquire after Wait = %v, want *NotObtainedError", err)
	}
	if ne.Remaining < 50*time.Second {
		t.Fatalf("Remaining = %v, want the holder's ~1m", ne.Remaining)
	}
	if took < wait || took > wait+2*time.Second {
		t.Fatalf("Wait of %v took %v", wait, took)
	}
	// 8ms doubling to a 256ms cap, with jitter down to half a step: at most
	// about 15 attempts in 1s; a fixed 8ms poll would make over 100.
	cmds, _ := hook.Take()
	n := len(cmds)
	t.Logf("%d attempts in a %v wait", n, wait)
	if n < 3 || n > 20 {
		t.Fatalf("%d attempts in a %v wait, want exponential backoff", n, wait)
	}
}

func TestWaitEndsOnCallerContext(t *testing.T) {
	_, rdb := startRedis(t)
	c := New(rdb, nil)
	key := testKey(t)
	mustAcquire(t, c, key, Options{TTL: time.Minute})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var cancelled atomic.Pointer[time.Time]
	go func() {
		time.Sleep(150 * time.Millisecond)
		now := time.Now()
		cancelled.Store(&now)
		cancel()
	}()
	_, err := c.Acquire(ctx, key, Options{TTL: time.Minute, Wait: 30 * time.Second})
	if !errors.Is(err, context.Canceled) || errors.Is(err, ErrNotObtained) || errors.Is(err, ErrUnavailable) {
		t.Fatalf("Acquire with a cancelled wait = %v, want context.Canceled", err)
	}
	if d := time.Since(*cancelled.Load()); d > time.Second {
		t.Fatalf("wait ended %v after the cancel", d)
	}

	dctx, dcancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer dcancel()
	start := time.Now()
	_, err = c.Acquire(dctx, key, Options{TTL: time.Minute, Wait: 30 * time.Second})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire past the caller's deadline = %v, want context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 1200*time.Millisecond {
		t.Fatalf("200ms deadline ended the wait after %v", d)
	}
}

// Many waiters on one key: each gets the lock exactly once, one at a time,
// with increasing fencing tokens.
func TestManyWaitersTakeTurns(t *testing.T) {
	_, rdb := startRedis(t)
	ctx := ctxT(t)
	c := New(rdb, nil)
	key := testKey(t)
	const waiters = 10
	var (
		holders atomic.Int32
		mu      sync.Mutex
		fences  []int64
		got     = map[int]int{}
		wg      sync.WaitGroup
	)
	for w := range waiters {
		wg.Go(func() {
			l, err := c.Acquire(ctx, key, Options{TTL: 10 * time.Second, Wait: 15 * time.Second})
			if err != nil {
				t.Errorf("waiter %d: %v", w, err)
				return
			}
			if n := holders.Add(1); n != 1 {
				t.Errorf("%d holders at once", n)
			}
			mu.Lock()
			fences = append(fences, l.Fence())
			got[w]++
			mu.Unlock()
			time.Sleep(20 * time.Millisecond)
			holders.Add(-1)
			if err := l.Release(ctx); err != nil {
				t.Errorf("waiter %d release: %v", w, err)
			}
		})
	}
	wg.Wait()
	if len(got) != waiters {
		t.Fatalf("%d of %d waiters got the lock", len(got), waiters)
	}
	for w, n := range got {
		if n != 1 {
			t.Fatalf("waiter %d got the lock %d times", w, n)
		}
	}
	for i := 1; i < len(fences); i++ {
		if fences[i] <= fences[i-1] {
			t.Fatalf("fences not increasing in holding order: %v", fences)
		}
	}
}
