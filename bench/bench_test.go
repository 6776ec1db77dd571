package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	bsm "github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	redsyncgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidislock"

	"github.com/reqlock/caddy-redis-lock/internal/redistest"
	"github.com/reqlock/caddy-redis-lock/lock"
)

// Every library holds its lock for the same lease.
const ttl = 10 * time.Second

// poolSize is the connection pool of every go-redis client: one connection
// per goroutine of the parallel shapes (SetParallelism(32) on GOMAXPROCS 2),
// so none of them waits for a connection.
const poolSize = 64

// cycler is one library's acquire+release cycle.
type cycler interface {
	// cycle tries once to acquire key without waiting and, when it got the
	// lock, releases it. It reports whether the lock was obtained; an error
	// is anything but plain contention.
	cycle(ctx context.Context, key string) (bool, error)
	close()
}

// libs are the contenders, in the order of the table's columns: the first is
// benchstat's base.
var libs []struct {
	name string
	c    cycler
}

// redisAddr is the benchmarks' redis-server.
var redisAddr string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if !redistest.Available() {
		fmt.Fprintln(os.Stderr, "bench: redis-server not found on PATH: run `make bench`, which installs it, or apt-get install -y redis-server")
		return 1
	}
	srv, err := redistest.Launch()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	defer srv.Close()
	redisAddr = srv.Addr
	redisPID = findRedisPID(srv.Port)

	rl, err := newRueidis(srv.Addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench: rueidislock:", err)
		return 1
	}
	add := func(name string, c cycler) {
		libs = append(libs, struct {
			name string
			c    cycler
		}{name, c})
	}
	add("raw", newRaw(srv.Addr))
	add("reqlock", newReqlock(srv.Addr))
	rap, err := newReqlockAutoPipeline(srv.Addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench: autopipeline:", err)
		return 1
	}
	add("bsm", newBSM(srv.Addr))
	add("redsync", newRedsync(srv.Addr))
	add("rueidislock", rl)
	// Not a peer library: this library over go-redis's AutoPipeliner, which
	// batches concurrent commands into pipelines (the load test's question).
	add("reqlock-autopipeline", rap)
	defer func() {
		for _, l := range libs {
			l.c.close()
		}
	}()
	return m.Run()
}

// newGoRedis is the one go-redis configuration every go-redis based library
// gets, each its own client.
func newGoRedis(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr:                  addr,
		PoolSize:              poolSize,
		MinIdleConns:          poolSize,
		ContextTimeoutEnabled: true,
	})
}

// BenchmarkSerial: one goroutine, one key, acquire then release.
func BenchmarkSerial(b *testing.B) {
	for _, l := range libs {
		b.Run("lib="+l.name, func(b *testing.B) {
			ctx := context.Background()
			key := "bench:" + l.name + ":serial"
			warm(b, l.c, key)
			b.ReportAllocs()
			cpu := startCPU(b)
			b.ResetTimer()
			for b.Loop() {
				ok, err := l.c.cycle(ctx, key)
				if err != nil || !ok {
					b.Fatalf("cycle: obtained=%v err=%v", ok, err)
				}
			}
			b.StopTimer()
			cpu.report()
		})
	}
}

// BenchmarkParallelDistinct: 32 goroutines per CPU, each cycling its own key,
// so nothing contends but the client, the network and Redis.
func BenchmarkParallelDistinct(b *testing.B) { benchParallel(b, false) }

// BenchmarkParallelFresh: as ParallelDistinct, but every op locks a key never
// used before, as the handler does with idempotency keys: for reqlock that is
// the path that starts a new fencing counter. Building the key costs every
// library the same two allocations.
func BenchmarkParallelFresh(b *testing.B) { benchParallel(b, true) }

// benchParallel runs 32 goroutines per CPU on keys of their own: one per
// goroutine, or (fresh) a new one every op.
func benchParallel(b *testing.B, fresh bool) {
	for _, l := range libs {
		b.Run("lib="+l.name, func(b *testing.B) {
			var seq atomic.Int64
			next := func() string { return "bench:" + l.name + ":p:" + strconv.FormatInt(seq.Add(1), 10) }
			warm(b, l.c, "bench:"+l.name+":warm")
			b.SetParallelism(32)
			b.ReportAllocs()
			cpu := startCPU(b)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				key := next()
				for pb.Next() {
					if fresh {
						key = next()
					}
					ok, err := l.c.cycle(ctx, key)
					if err != nil || !ok {
						b.Errorf("cycle %s: obtained=%v err=%v", key, ok, err)
						return
					}
				}
			})
			b.StopTimer()
			cpu.report()
		})
	}
}

// BenchmarkHotKey: 32 goroutines per CPU on one key. An op is one attempt;
// obtained/op is the share of attempts that got the lock.
func BenchmarkHotKey(b *testing.B) {
	for _, l := range libs {
		b.Run("lib="+l.name, func(b *testing.B) {
			key := "bench:" + l.name + ":hot"
			warm(b, l.c, key)
			var obtained, refused atomic.Int64
			b.SetParallelism(32)
			b.ReportAllocs()
			cpu := startCPU(b)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				for pb.Next() {
					ok, err := l.c.cycle(ctx, key)
					if err != nil {
						b.Errorf("cycle: %v", err)
						return
					}
					if ok {
						obtained.Add(1)
					} else {
						refused.Add(1)
					}
				}
			})
			b.StopTimer()
			cpu.report()
			if n := obtained.Load() + refused.Load(); n > 0 {
				b.ReportMetric(float64(obtained.Load())/float64(n), "obtained/op")
			}
		})
	}
}

// warm makes sure the library's scripts are loaded and its connections open,
// so the first timed iterations measure the steady state.
func warm(b *testing.B, c cycler, key string) {
	b.Helper()
	for range 3 {
		if ok, err := c.cycle(context.Background(), key); err != nil || !ok {
			b.Fatalf("warm-up cycle: obtained=%v err=%v", ok, err)
		}
	}
}

// reqlock: this project's library with default options, which issues a
// fencing token and arms the keep-alive timer on every acquire.
type reqlockCycler struct {
	rdb *redis.Client
	c   *lock.Client
}

func newReqlock(addr string) *reqlockCycler {
	rdb := newGoRedis(addr)
	return &reqlockCycler{rdb: rdb, c: lock.New(rdb, nil)}
}

func (r *reqlockCycler) cycle(ctx context.Context, key string) (bool, error) {
	l, err := r.c.Acquire(ctx, key, lock.Options{TTL: ttl})
	if errors.Is(err, lock.ErrNotObtained) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if l.Fence() <= 0 {
		return false, fmt.Errorf("no fencing token: %d", l.Fence())
	}
	return true, l.Release(ctx)
}

func (r *reqlockCycler) close() { r.rdb.Close() }

// newReqlockAutoPipeline is reqlock on the same go-redis options, through the
// client's AutoPipeliner.
func newReqlockAutoPipeline(addr string) (*reqlockCycler, error) {
	rdb := newGoRedis(addr)
	ap, err := rdb.AutoPipeline()
	if err != nil {
		rdb.Close()
		return nil, err
	}
	return &reqlockCycler{rdb: rdb, c: lock.New(ap, nil)}, nil
}

// bsm: github.com/bsm/redislock, no retry.
type bsmCycler struct {
	rdb *redis.Client
	c   *bsm.Client
}

func newBSM(addr string) *bsmCycler {
	rdb := newGoRedis(addr)
	return &bsmCycler{rdb: rdb, c: bsm.New(rdb)}
}

func (r *bsmCycler) cycle(ctx context.Context, key string) (bool, error) {
	l, err := r.c.Obtain(ctx, key, ttl, nil)
	if errors.Is(err, bsm.ErrNotObtained) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return true, l.Release(ctx)
}

func (r *bsmCycler) close() { r.rdb.Close() }

// redsync: github.com/go-redsync/redsync/v4 over one go-redis v9 pool, one
// try (its TryLock).
type redsyncCycler struct {
	rdb *redis.Client
	rs  *redsync.Redsync
}

func newRedsync(addr string) *redsyncCycler {
	rdb := newGoRedis(addr)
	return &redsyncCycler{rdb: rdb, rs: redsync.New(redsyncgoredis.NewPool(rdb))}
}

func (r *redsyncCycler) cycle(ctx context.Context, key string) (bool, error) {
	m := r.rs.NewMutex(key, redsync.WithExpiry(ttl), redsync.WithTries(1))
	err := m.TryLockContext(ctx)
	var taken *redsync.ErrTaken
	if errors.Is(err, redsync.ErrFailed) || errors.As(err, &taken) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	ok, err := m.UnlockContext(ctx)
	if err == nil && !ok {
		err = errors.New("redsync: unlock reported not held")
	}
	return true, err
}

func (r *redsyncCycler) close() {}

// rueidislock: github.com/redis/rueidis/rueidislock with one key per lock
// (KeyMajority 1; its default of 2 takes 2 of 3 keys on the same server),
// which also keeps its lock alive until released. Its per-key acquire timeout
// (TryNextAfter, default 20ms) is raised to 1s like the others' command
// timeouts: 20ms fails under load on a shared 2-core machine.
type rueidisCycler struct {
	l rueidislock.Locker
}

func newRueidis(addr string) (*rueidisCycler, error) {
	l, err := rueidislock.NewLocker(rueidislock.LockerOption{
		ClientOption: rueidis.ClientOption{InitAddress: []string{addr}},
		KeyMajority:  1,
		KeyValidity:  ttl,
		TryNextAfter: time.Second,
	})
	if err != nil {
		return nil, err
	}
	return &rueidisCycler{l: l}, nil
}

func (r *rueidisCycler) cycle(ctx context.Context, key string) (bool, error) {
	_, cancel, err := r.l.TryWithContext(ctx, key)
	if errors.Is(err, rueidislock.ErrNotLocked) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	cancel() // releases the key and waits until it is deleted
	return true, nil
}

func (r *rueidisCycler) close() { r.l.Close() }

// raw: the floor. SET key token NX PX ttl, then EVALSHA of a compare-and-delete
// script; the same random token as the library, no fencing, no keep-alive.
type rawCycler struct {
	rdb *redis.Client
}

var rawRelease = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

func newRaw(addr string) *rawCycler { return &rawCycler{rdb: newGoRedis(addr)} }

func (r *rawCycler) cycle(ctx context.Context, key string) (bool, error) {
	token := uuid.NewString()
	ok, err := r.rdb.SetNX(ctx, key, token, ttl).Result()
	if err != nil || !ok {
		return false, err
	}
	n, err := rawRelease.Run(ctx, r.rdb, []string{key}, token).Int64()
	if err == nil && n != 1 {
		err = errors.New("raw: release found another token")
	}
	return true, err
}

func (r *rawCycler) close() { r.rdb.Close() }
