package engine

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/caddy-redis-lock/internal/redisscript"
	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

// masters starts n independent redis-servers and a Redlock client on them.
func masters(t *testing.T, n int) ([]*redistest.Server, []*redis.Client, *Client) {
	t.Helper()
	srvs := make([]*redistest.Server, n)
	rdbs := make([]*redis.Client, n)
	clients := make([]redis.UniversalClient, n)
	names := make([]string, n)
	for i := range n {
		srvs[i] = redistest.Start(t)
		// One retry and one dial attempt, as the Caddy handler has: a
		// stopped master fails fast.
		rdbs[i] = redis.NewClient(&redis.Options{Addr: srvs[i].Addr, ContextTimeoutEnabled: true,
			MaxRetries: 1, DialerRetries: 1, DialTimeout: time.Second})
		t.Cleanup(func() { _ = rdbs[i].Close() })
		clients[i], names[i] = rdbs[i], srvs[i].Addr
	}
	rl, err := NewRedlock(clients, names)
	if err != nil {
		t.Fatal(err)
	}
	return srvs, rdbs, NewWithBackend(rl, &Config{CallTimeout: 2 * time.Second})
}

// redlockWithLast is the Redlock of rdbs[0], rdbs[1] and last, a third
// master that misbehaves as a test needs.
func redlockWithLast(t *testing.T, rdbs []*redis.Client, last Master) *Redlock {
	t.Helper()
	rl, err := NewRedlockOf([]Master{NewRedis(rdbs[0]), NewRedis(rdbs[1]), last}, []string{"m0", "m1", "m2"})
	if err != nil {
		t.Fatal(err)
	}
	return rl
}

func TestRedlockNeedsOddMajority(t *testing.T) {
	for _, n := range []int{0, 1, 2, 4} {
		if _, err := NewRedlock(make([]redis.UniversalClient, n), make([]string, n)); err == nil {
			t.Errorf("%d masters accepted", n)
		}
	}
}

func TestRedlockMajority(t *testing.T) {
	for _, n := range []int{3, 5} {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			srvs, rdbs, c := masters(t, n)
			ctx := ctxT(t)
			key := testKey(t)
			l := mustAcquire(t, c, key, Options{TTL: time.Minute})
			held := 0
			for _, rdb := range rdbs {
				if rdb.HExists(ctx, key, l.Token()).Val() {
					held++
				}
			}
			if held < n/2+1 {
				t.Fatalf("lock on %d of %d masters", held, n)
			}
			// Contention: another holder is refused with the lease left.
			_, err := c.Acquire(ctx, key, Options{TTL: time.Minute})
			var ne *NotObtainedError
			if !errors.As(err, &ne) || ne.Remaining < 50*time.Second {
				t.Fatalf("second acquire: %v, want NotObtained with ~1m left", err)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
			// Release returns once a majority released; the others follow.
			for i, rdb := range rdbs {
				redistest.Eventually(t, 2*time.Second, fmt.Sprintf("release on master %d", i), func() bool {
					return rdb.Exists(ctx, key).Val() == 0
				})
			}

			// A minority down: locks still work, and keep-alive renews on
			// the majority.
			minority := n / 2
			for i := range minority {
				srvs[i].Stop()
			}
			l = mustAcquire(t, c, key, Options{TTL: 600 * time.Millisecond})
			if waitDone(t, l.Context(), 1500*time.Millisecond) {
				t.Fatalf("lock lost with a majority up: %v", context.Cause(l.Context()))
			}
			if err := l.Release(ctx); err != nil {
				t.Fatalf("release with a majority up: %v", err)
			}

			// A majority down: unavailable, never granted.
			srvs[minority].Stop()
			if _, err := c.Acquire(ctx, key, Options{TTL: time.Minute}); !errors.Is(err, ErrUnavailable) {
				t.Fatalf("acquire with a majority down: %v, want ErrUnavailable", err)
			}
			var nerr *NodeError
			if _, err := c.Acquire(ctx, key, Options{TTL: time.Minute}); !errors.As(err, &nerr) || nerr.Node == "" {
				t.Fatalf("error %v does not name a master", err)
			}
		})
	}
}

// Fencing tokens increase across holders even when one master's counter (or
// clock) runs far ahead of the others': the token is the majority's largest,
// written back to a majority, so a later majority without that master
// still issues a larger one.
func TestRedlockFencingWithCounterAhead(t *testing.T) {
	srvs, rdbs, c := masters(t, 3)
	ctx := ctxT(t)
	key := testKey(t)
	const ahead = 9_000_000_000_000_000
	if err := rdbs[2].Set(ctx, CounterKey(key), ahead, 0).Err(); err != nil {
		t.Fatal(err)
	}
	// The first holder's majority is masters 1 and 2 (0 is down), so its
	// token comes from the counter ahead.
	srvs[0].Stop()
	l := mustAcquire(t, c, key, Options{TTL: time.Minute})
	if l.Fence() <= ahead {
		t.Fatalf("fence %d, want above the counter ahead %d (the majority's largest)", l.Fence(), int64(ahead))
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// The next holder's majority is masters 0 (back, empty) and 1: without
	// the write-back, its token would come from the clock, far below.
	if err := srvs[0].Restart(); err != nil {
		t.Fatal(err)
	}
	srvs[2].Stop()
	next := mustAcquire(t, c, key, Options{TTL: time.Minute})
	if next.Fence() <= l.Fence() {
		t.Fatalf("next holder without the master ahead: fence %d, want above %d", next.Fence(), l.Fence())
	}
}

// A lock held on one master by a stale holder (a minority) does not stop a
// majority from granting it.
func TestRedlockMinorityHeldElsewhere(t *testing.T) {
	_, rdbs, c := masters(t, 3)
	key := testKey(t)
	holdAs(t, rdbs[0], key, "stale", time.Minute)
	l := mustAcquire(t, c, key, Options{TTL: time.Minute})
	if holderOf(t, rdbs[0], key) != "stale" {
		t.Fatal("the stale holder's lock on one master was overwritten")
	}
	_ = l
}

// slowMaster is a master whose acquires wait until gate is closed: the
// master a majority does not wait for.
type slowMaster struct {
	*Redis
	gate chan struct{}
}

func (m slowMaster) TryAcquire(ctx context.Context, key, token string, ttl time.Duration) (int64, error) {
	<-m.gate
	return m.Redis.TryAcquire(ctx, key, token, ttl)
}

// slowLast returns the Redlock of three masters whose last one answers
// acquires only once the returned gate is closed.
func slowLast(t *testing.T) ([]*redis.Client, *Redlock, chan struct{}) {
	t.Helper()
	_, rdbs, _ := masters(t, 3)
	gate := make(chan struct{})
	nodes := []Master{NewRedis(rdbs[0]), NewRedis(rdbs[1]), slowMaster{NewRedis(rdbs[2]), gate}}
	rl, err := NewRedlockOf(nodes, []string{"m0", "m1", "m2"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		select {
		case <-gate:
		default:
			close(gate)
		}
	})
	return rdbs, rl, gate
}

// A lock released before a slow master granted it is released there too
// once it did, not left there for its lease.
func TestRedlockReleaseBeforeLateGrant(t *testing.T) {
	rdbs, rl, gate := slowLast(t)
	c := NewWithBackend(rl, &Config{CallTimeout: 5 * time.Second})
	ctx := ctxT(t)
	key := testKey(t)
	l := mustAcquire(t, c, key, Options{TTL: time.Minute})
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	close(gate)
	for i, rdb := range rdbs {
		redistest.Eventually(t, 2*time.Second, fmt.Sprintf("lock gone from master %d", i), func() bool {
			return rdb.Exists(ctx, key).Val() == 0
		})
	}
}

// A refused attempt does not wait for a slow master, and gives back what
// that master grants later. A retry with the same token does not wait for
// it either, but its own acquire on that master waits until the give-back
// there is done, so that the give-back does not delete the retry's grant.
func TestRedlockRefusedAttemptGivesBackLateGrant(t *testing.T) {
	rdbs, rl, gate := slowLast(t)
	ctx, cancel := context.WithTimeout(ctxT(t), 5*time.Second)
	defer cancel()
	key := testKey(t)
	holdAs(t, rdbs[0], key, "other", time.Minute)
	holdAs(t, rdbs[1], key, "other", time.Minute)
	var ne *NotObtainedError
	if _, err := rl.TryAcquire(ctx, key, "tok", time.Minute); !errors.As(err, &ne) {
		t.Fatalf("acquire against a majority held elsewhere: %v, want NotObtained before the slow master answered", err)
	}

	rdbs[0].Del(ctx, key)
	rdbs[1].Del(ctx, key)
	if _, err := rl.TryAcquire(ctx, key, "tok", time.Minute); err != nil {
		t.Fatalf("retry with the slow master still pending: %v", err)
	}
	close(gate)
	for i, rdb := range rdbs {
		redistest.Eventually(t, 2*time.Second, fmt.Sprintf("retry's lock on master %d", i), func() bool {
			return rdb.HExists(ctx, key, "tok").Val()
		})
	}
	// Nothing of the first attempt is left to delete it.
	time.Sleep(100 * time.Millisecond)
	for i, rdb := range rdbs {
		if !rdb.HExists(ctx, key, "tok").Val() {
			t.Fatalf("the retry's lock was deleted from master %d", i)
		}
	}
}

// lateMaster grants after the caller's deadline: its write lands, and its
// answer is a timeout, as when the reply is lost on the way.
type lateMaster struct {
	*Redis
	granted chan error // the late write's outcome
}

func (m lateMaster) TryAcquire(ctx context.Context, key, token string, ttl time.Duration) (int64, error) {
	<-ctx.Done()
	_, err := m.Redis.TryAcquire(context.WithoutCancel(ctx), key, token, ttl)
	m.granted <- err
	return 0, redisscript.Classify(ctx, ctx.Err())
}

// What a master granted after the attempt's deadline is given back all the
// same: the give-back has a deadline of its own.
func TestRedlockGivesBackGrantAfterDeadline(t *testing.T) {
	_, rdbs, _ := masters(t, 3)
	late := lateMaster{NewRedis(rdbs[2]), make(chan error, 1)}
	rl := redlockWithLast(t, rdbs, late)
	key := testKey(t)
	holdAs(t, rdbs[0], key, "other", time.Minute)
	holdAs(t, rdbs[1], key, "other", time.Minute)
	ctx, cancel := context.WithTimeout(ctxT(t), 300*time.Millisecond)
	defer cancel()
	var ne *NotObtainedError
	if _, err := rl.TryAcquire(ctx, key, "tok", time.Minute); !errors.As(err, &ne) {
		t.Fatalf("acquire against a majority held elsewhere: %v, want NotObtained", err)
	}
	if err := <-late.granted; err != nil {
		t.Fatalf("the late grant: %v", err)
	}
	bg := ctxT(t)
	redistest.Eventually(t, 3*time.Second, "the late grant on master 2 given back", func() bool {
		return rdbs[2].Exists(bg, key).Val() == 0
	})
}

// slowRaise is a master whose fencing write-backs reach Redis a while after
// they are sent: the master that answers after the majority.
type slowRaise struct {
	*Redis
	raised chan error
}

func (m slowRaise) RaiseFence(ctx context.Context, key string, fence int64) error {
	time.Sleep(100 * time.Millisecond)
	err := m.Redis.RaiseFence(ctx, key, fence)
	m.raised <- err
	return err
}

// The winning token is written back to every master, also to one that
// answers after the majority and so after the acquire returned (and its
// call context ended): no master's counter is left behind.
func TestRedlockRaiseReachesLateMaster(t *testing.T) {
	_, rdbs, _ := masters(t, 3)
	slow := slowRaise{NewRedis(rdbs[2]), make(chan error, 1)}
	rl := redlockWithLast(t, rdbs, slow)
	c := NewWithBackend(rl, &Config{CallTimeout: 2 * time.Second})
	ctx := ctxT(t)
	key := testKey(t)
	// Masters 0 and 1 are ahead, so every majority's token is above the
	// clock's, which master 2 issues.
	const ahead = 9_000_000_000_000_000
	for _, rdb := range rdbs[:2] {
		if err := rdb.Set(ctx, CounterKey(key), ahead, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	l := mustAcquire(t, c, key, Options{TTL: time.Minute})
	if l.Fence() <= ahead {
		t.Fatalf("fence %d, want above the counter ahead", l.Fence())
	}
	select {
	case err := <-slow.raised:
		if err != nil {
			t.Fatalf("the late master's write-back: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the late master's write-back never ran")
	}
	if got, _ := rdbs[2].Get(ctx, CounterKey(key)).Int64(); got < l.Fence() {
		t.Fatalf("the late master's counter is %d, want at least the token %d", got, l.Fence())
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
