package engine

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/caddy-redis-lock/internal/redisscript"
	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

func TestErrorsAreDistinct(t *testing.T) {
	all := map[string]error{
		"ErrNotObtained": ErrNotObtained,
		"ErrNotHeld":     ErrNotHeld,
		"ErrUnavailable": ErrUnavailable,
		"ErrReleased":    ErrReleased,
		"Canceled":       context.Canceled,
		"Deadline":       context.DeadlineExceeded,
	}
	for an, a := range all {
		for bn, b := range all {
			if (an == bn) != errors.Is(a, b) {
				t.Errorf("errors.Is(%s, %s) = %v", an, bn, errors.Is(a, b))
			}
		}
	}
	// ErrLeaseExpired is a kind of not held.
	if !errors.Is(ErrLeaseExpired, ErrNotHeld) || errors.Is(ErrNotHeld, ErrLeaseExpired) {
		t.Error("ErrLeaseExpired must match ErrNotHeld, not the reverse")
	}
	ne := error(&NotObtainedError{Remaining: time.Second})
	if !errors.Is(ne, ErrNotObtained) || errors.Is(ne, ErrNotHeld) || errors.Is(ne, ErrUnavailable) {
		t.Error("NotObtainedError must match ErrNotObtained only")
	}
	// Classify keeps the caller's context error, wraps anything else.
	cctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := redisscript.Classify(cctx, errors.New("x")); !errors.Is(err, context.Canceled) || errors.Is(err, ErrUnavailable) {
		t.Errorf("Classify(cancelled) = %v", err)
	}
	if err := redisscript.Classify(context.Background(), errors.New("x")); !errors.Is(err, ErrUnavailable) {
		t.Errorf("Classify = %v", err)
	}
	// An internal deadline (not the caller's) is unavailability only.
	if err := redisscript.Classify(context.Background(), context.DeadlineExceeded); !errors.Is(err, ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Classify(internal deadline) = %v", err)
	}
}

// fastFailRDB is a client that gives up on a dead server after one dial: the
// default retries only make these tests slow.
func fastFailRDB(t *testing.T, addr string) *redis.Client {
	rdb := redis.NewClient(&redis.Options{
		Addr: addr, ContextTimeoutEnabled: true, DialTimeout: time.Second,
		DialerRetries: 1, MaxRetries: -1,
	})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// checkUnavailable asserts err is ErrUnavailable and nothing else.
func checkUnavailable(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, ErrUnavailable) || errors.Is(err, ErrNotObtained) || errors.Is(err, ErrNotHeld) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("%s = %v, want ErrUnavailable only", what, err)
	}
}

func TestErrUnavailableWhenRedisStopped(t *testing.T) {
	srv := redistest.Start(t)
	rdb := fastFailRDB(t, srv.Addr)
	ctx := ctxT(t)
	c := New(rdb, nil)
	key := testKey(t)
	l := mustAcquire(t, c, key, Options{TTL: time.Minute, Renew: NoRenew})
	srv.Stop()

	_, err := c.Acquire(ctx, key+"2", Options{TTL: time.Minute})
	checkUnavailable(t, "Acquire on a stopped Redis", err)
	checkUnavailable(t, "Refresh on a stopped Redis", l.Refresh(ctx, time.Minute))
	if l.Context().Err() != nil {
		t.Fatal("an unreachable Redis is not a lost lock until the deadline")
	}
	checkUnavailable(t, "Release on a stopped Redis", l.Release(ctx))
}

func TestErrUnavailableOnClosedPort(t *testing.T) {
	port, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	c := New(fastFailRDB(t, "127.0.0.1:"+strconv.Itoa(port)), nil)
	_, err = c.Acquire(ctxT(t), "k", Options{TTL: time.Second})
	checkUnavailable(t, "Acquire on a closed port", err)
}

func TestContextErrors(t *testing.T) {
	srv, rdb := startRedis(t)
	c := New(rdb, nil)
	key := testKey(t)
	mustAcquire(t, c, key+"-warm", Options{TTL: time.Minute})

	cctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.Acquire(cctx, key, Options{TTL: time.Minute}); !errors.Is(err, context.Canceled) || errors.Is(err, ErrUnavailable) {
		t.Fatalf("Acquire with a cancelled context = %v, want context.Canceled", err)
	}

	// A hung Redis: the caller's deadline bounds the call and is reported
	// as such, not as unavailability.
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Resume() })
	dctx, dcancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer dcancel()
	start := time.Now()
	_, err := c.Acquire(dctx, key, Options{TTL: time.Minute})
	took := time.Since(start)
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrUnavailable) {
		t.Fatalf("Acquire past its deadline on a paused Redis = %v, want context.DeadlineExceeded", err)
	}
	if took > 1500*time.Millisecond {
		t.Fatalf("200ms deadline returned after %v", took)
	}
}

// Release on a hung Redis gives up at ReleaseTimeout. That is Redis not
// answering, not the caller's deadline: ErrUnavailable, never
// context.DeadlineExceeded (which a handler would read as its own timeout).
func TestReleaseOnHungRedisIsUnavailable(t *testing.T) {
	srv, rdb := startRedis(t)
	c := New(rdb, &Config{ReleaseTimeout: 200 * time.Millisecond})
	l := mustAcquire(t, c, testKey(t), Options{TTL: time.Minute, Renew: NoRenew})
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Resume() })
	start := time.Now()
	err := l.Release(ctxT(t))
	took := time.Since(start)
	_ = srv.Resume()
	checkUnavailable(t, "Release on a paused Redis", err)
	if took > 1500*time.Millisecond {
		t.Fatalf("Release with a 200ms ReleaseTimeout took %v", took)
	}
}
