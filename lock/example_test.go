package lock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/caddy-redis-lock/internal/redistest"
	"github.com/reqlock/caddy-redis-lock/lock"
)

// exampleRedis starts a redis-server on a free port for an example. Real
// programs pass the address of their Redis. The examples that call it need
// redis-server installed (make test installs it), as the package's tests do.
func exampleRedis() (addr string, stop func()) {
	s, err := redistest.Launch()
	if err != nil {
		panic("the lock examples need redis-server on PATH (apt-get install redis-server): " + err.Error())
	}
	return s.Addr, s.Close
}

func ExampleKey() {
	// Client data (an Idempotency-Key) never appears in Redis key names.
	key := lock.Key(lock.DefaultPrefix, "idem", "abc-123")
	fmt.Println(key)
	// Its fencing counter shares its Cluster hash tag: at most 65,536
	// counters per prefix, however many keys are locked.
	fmt.Println(lock.CounterKey(key))
	// Output:
	// redis_lock:{e986}e986f6af1489bb794e6f0da5d0d1748f2de3714348952ac2aba611289f3f5760
	// redis_lock:{e986}fence
}

func ExampleClient_Acquire() {
	addr, stop := exampleRedis()
	defer stop()
	// ContextTimeoutEnabled lets the caller's deadline bound each call.
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	locks := lock.New(rdb, nil)
	ctx := context.Background()
	key := lock.Key(lock.DefaultPrefix, "orders", "order-42")

	l, err := locks.Acquire(ctx, key, lock.Options{TTL: 10 * time.Second})
	if err != nil {
		fmt.Println("acquire:", err)
		return
	}
	// Hand l.Fence() to the protected resource; it rejects smaller ones.
	fmt.Println("held, fence > 0:", l.Fence() > 0)

	// A second caller is told the lock is taken, and for how long.
	_, err = locks.Acquire(ctx, key, lock.Options{TTL: 10 * time.Second})
	var busy *lock.NotObtainedError
	if errors.As(err, &busy) {
		fmt.Println("busy:", errors.Is(err, lock.ErrNotObtained), "retry within 10s:", busy.Remaining <= 10*time.Second)
	}

	if err := l.Release(ctx); err != nil {
		fmt.Println("release:", err)
	}
	// Releasing twice is harmless: the lock is no longer ours.
	fmt.Println("second release:", errors.Is(l.Release(ctx), lock.ErrNotHeld))
	// Output:
	// held, fence > 0: true
	// busy: true retry within 10s: true
	// second release: true
}

func ExampleClient_Acquire_wait() {
	addr, stop := exampleRedis()
	defer stop()
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	locks := lock.New(rdb, nil)
	ctx := context.Background()
	key := lock.Key(lock.DefaultPrefix, "jobs", "nightly")

	first, _ := locks.Acquire(ctx, key, lock.Options{TTL: 10 * time.Second})
	go func() {
		time.Sleep(50 * time.Millisecond)
		_ = first.Release(ctx)
	}()
	// Wait up to 5s for the holder to let go.
	second, err := locks.Acquire(ctx, key, lock.Options{TTL: 10 * time.Second, Wait: 5 * time.Second})
	if err != nil {
		fmt.Println("acquire:", err)
		return
	}
	defer second.Release(ctx)
	fmt.Println("got it after the first holder; larger fence:", second.Fence() > first.Fence())
	// Output:
	// got it after the first holder; larger fence: true
}

func ExampleLock_Context() {
	addr, stop := exampleRedis()
	defer stop()
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	locks := lock.New(rdb, nil)
	ctx := context.Background()

	l, err := locks.Acquire(ctx, lock.Key(lock.DefaultPrefix, "jobs", "report"), lock.Options{TTL: 3 * time.Second})
	if err != nil {
		fmt.Println("acquire:", err)
		return
	}
	// Do the work under l.Context(): the keep-alive renews the lease and
	// cancels this context if the lock is lost.
	work := l.Context()
	select {
	case <-work.Done():
		fmt.Println("lost:", context.Cause(work))
	case <-time.After(100 * time.Millisecond):
		fmt.Println("work done while held")
	}
	_ = l.Release(ctx)
	fmt.Println("cause after release:", context.Cause(work))
	// Output:
	// work done while held
	// cause after release: redislock: lock released
}

func ExampleLocker() {
	// Code that takes locks depends on the interface, so a multi-instance
	// (Redlock) implementation can replace the Client later.
	var locker lock.Locker = lock.New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"}), nil)
	_ = locker
}

func ExampleNewRedlock() {
	// One client per master, an odd number of them (at least 3); the
	// addresses name the masters in errors.
	addrs := []string{"10.0.2.1:6379", "10.0.2.2:6379", "10.0.2.3:6379"}
	clients := make([]redis.UniversalClient, len(addrs))
	for i, a := range addrs {
		clients[i] = redis.NewClient(&redis.Options{Addr: a, ContextTimeoutEnabled: true, MaxRetries: 1})
	}
	rl, err := lock.NewRedlock(clients, addrs)
	if err != nil {
		fmt.Println("redlock:", err) // an even number of masters, or fewer than 3
		return
	}
	locks := lock.NewWithBackend(rl, &lock.Config{CallTimeout: time.Second})
	ctx := context.Background()
	l, err := locks.Acquire(ctx, lock.Key(lock.DefaultPrefix, "orders", "order-42"), lock.Options{TTL: 10 * time.Second})
	var ne *lock.NodeError
	switch {
	case errors.Is(err, lock.ErrUnavailable) && errors.As(err, &ne):
		fmt.Println("no majority; first failed master:", ne.Node)
		return
	case err != nil:
		fmt.Println("acquire:", err)
		return
	}
	defer l.Release(ctx)
	fmt.Println("held on a majority of", len(addrs), "masters; fence:", l.Fence())
}
