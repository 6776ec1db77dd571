package engine

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

// lateBackend is a Redis whose acquires reach Redis late: each one runs
// only after its caller gave up and gave the token back, as a script that
// waited in one connection's socket buffer while a paused Redis came back
// runs after a release sent later on another connection.
type lateBackend struct {
	*Redis
	gaveBack chan struct{} // closed by the first GiveBack
	once     sync.Once     // a give-back not answered in time is tried again
	ran      chan error    // the late acquire's result
}

func (b *lateBackend) TryAcquire(ctx context.Context, key, token string, ttl time.Duration) (int64, error) {
	go func() {
		<-b.gaveBack
		_, err := b.Redis.TryAcquire(context.Background(), key, token, ttl)
		b.ran <- err
	}()
	<-ctx.Done()
	return 0, ErrUnavailable
}

func (b *lateBackend) GiveBack(ctx context.Context, key, token string, ttl time.Duration) error {
	err := b.Redis.GiveBack(ctx, key, token, ttl)
	b.once.Do(func() { close(b.gaveBack) })
	return err
}

// An acquire that did not answer in time is given back, and when it runs
// after the give-back it takes nothing: the key is free for the next
// request at once, not held for a lease that nobody renews or releases.
func TestGiveBackBeforeLateAcquire(t *testing.T) {
	srv, rdb := startRedis(t)
	ctx := ctxT(t)
	c := New(newRDB(t, srv.Addr), &Config{CallTimeout: 100 * time.Millisecond})
	late := &lateBackend{Redis: NewRedis(newRDB(t, srv.Addr)), gaveBack: make(chan struct{}), ran: make(chan error, 1)}
	key := testKey(t)
	if _, err := c.AcquireWith(ctx, late, key, Options{TTL: time.Minute}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("acquire that did not answer: %v, want ErrUnavailable", err)
	}
	var err error
	select {
	case err = <-late.ran:
	case <-time.After(5 * time.Second):
		t.Fatal("the late acquire did not run: the token was never given back")
	}
	var ne *NotObtainedError
	if !errors.As(err, &ne) {
		t.Fatalf("late acquire after the give-back: %v, want not obtained", err)
	}
	if n := rdb.Exists(ctx, key).Val(); n != 0 {
		t.Fatalf("the late acquire left the lock (fields %v, pttl %v)", rdb.HGetAll(ctx, key).Val(), rdb.PTTL(ctx, key).Val())
	}
	// The next request takes the key at once.
	l := mustAcquire(t, c, key, Options{TTL: time.Minute})
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// The give-back's mark lives a lease and concerns its token alone; a
// give-back that finds the lock taken releases it, as Release does.
func TestGiveBackMark(t *testing.T) {
	srv, rdb := startRedis(t)
	ctx := ctxT(t)
	r := NewRedis(newRDB(t, srv.Addr))
	key := testKey(t)
	if err := r.GiveBack(ctx, key, "t1", 30*time.Second); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("give-back of a lock never taken: %v, want ErrNotHeld", err)
	}
	if pttl := rdb.PTTL(ctx, GoneKey(key, "t1")).Val(); pttl <= 29*time.Second || pttl > 30*time.Second {
		t.Fatalf("the mark's TTL is %v, want the lease, 30s", pttl)
	}
	if _, err := r.TryAcquire(ctx, key, "t1", 30*time.Second); !errors.As(err, new(*NotObtainedError)) {
		t.Fatalf("acquire of the given-back token: %v, want not obtained", err)
	}
	if _, err := r.TryAcquire(ctx, key, "t2", 30*time.Second); err != nil {
		t.Fatalf("acquire of another token: %v", err)
	}
	// Held by t2, whose acquire answered: t1's late attempt stays refused,
	// and t2's give-back releases it.
	if _, err := r.TryAcquire(ctx, key, "t1", 30*time.Second); !errors.As(err, new(*NotObtainedError)) {
		t.Fatalf("acquire of the given-back token while another holds the key: %v, want not obtained", err)
	}
	if err := r.GiveBack(ctx, key, "t2", 30*time.Second); err != nil {
		t.Fatalf("give-back of a held lock: %v", err)
	}
	redistest.Eventually(t, time.Second, "the lock released", func() bool { return rdb.Exists(ctx, key).Val() == 0 })
}

// On a Redlock, a master whose acquire did not answer is given back with
// the mark too: its acquire, run after the give-back, takes nothing there.
func TestRedlockGiveBackBeforeLateAcquire(t *testing.T) {
	_, rdbs, _ := masters(t, 3)
	late := &lateBackend{Redis: NewRedis(rdbs[2]), gaveBack: make(chan struct{}), ran: make(chan error, 1)}
	rl := redlockWithLast(t, rdbs, late)
	key := testKey(t)
	holdAs(t, rdbs[0], key, "other", time.Minute)
	holdAs(t, rdbs[1], key, "other", time.Minute)
	ctx, cancel := context.WithTimeout(ctxT(t), 300*time.Millisecond)
	defer cancel()
	if _, err := rl.TryAcquire(ctx, key, "tok", time.Minute); !errors.As(err, new(*NotObtainedError)) {
		t.Fatalf("acquire against a majority held elsewhere: %v, want not obtained", err)
	}
	var err error
	select {
	case err = <-late.ran:
	case <-time.After(5 * time.Second):
		t.Fatal("master 2's late acquire did not run: its token was never given back")
	}
	if !errors.As(err, new(*NotObtainedError)) {
		t.Fatalf("master 2's late acquire after the give-back: %v, want not obtained", err)
	}
	if n := rdbs[2].Exists(ctxT(t), key).Val(); n != 0 {
		t.Fatal("master 2's late acquire left the lock")
	}
}

// pausedAcquire warms a connection of c's Redis client, pauses srv and
// acquires key: the acquire is written on the warm connection and waits in
// its socket buffer, and times out. The give-back goes on a new
// connection, whose handshake the paused Redis does not answer.
func pausedAcquire(t *testing.T, srv *redistest.Server, c *Client, key string) {
	t.Helper()
	warm := mustAcquire(t, c, key+"-warm", Options{TTL: time.Minute})
	if err := warm.Release(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Resume() })
	if _, err := c.Acquire(ctxT(t), key, Options{TTL: time.Minute}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("acquire on a paused Redis: %v, want ErrUnavailable", err)
	}
}

// A give-back that the paused Redis never answered is tried again until
// one is answered: the acquire that ran when Redis resumed holds the key
// for a moment, not for its minute's lease; then no try is left.
func TestGiveBackTriedUntilAnswered(t *testing.T) {
	srv, rdb := startRedis(t)
	ctx := ctxT(t)
	c := New(newRDB(t, srv.Addr), &Config{CallTimeout: 200 * time.Millisecond})
	key := testKey(t)
	pausedAcquire(t, srv, c, key)
	time.Sleep(time.Second) // several give-backs, none answered
	if n := c.Running(); n != 1 {
		t.Fatalf("%d background calls during the pause, want the give-back", n)
	}
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	resumed := time.Now()
	redistest.Eventually(t, 3*time.Second, "the give-back answered", func() bool { return c.Running() == 0 })
	if n := rdb.Exists(ctx, key).Val(); n != 0 {
		t.Fatalf("%v after Redis resumed, the lock is still held (pttl %v): the give-back was not tried again", time.Since(resumed), rdb.PTTL(ctx, key).Val())
	}
	if marks := rdb.Keys(ctx, key+":gone:*").Val(); len(marks) != 1 {
		t.Fatalf("give-back marks %v, want one", marks)
	}
	t.Logf("the key was free and the give-back done %v after Redis resumed", time.Since(resumed))
}

// The tries stop when the Redis client is closed, long before GiveBackFor.
func TestGiveBackStopsOnClosedClient(t *testing.T) {
	srv, _ := startRedis(t)
	rdb := newRDB(t, srv.Addr)
	c := New(rdb, &Config{CallTimeout: 200 * time.Millisecond})
	pausedAcquire(t, srv, c, testKey(t))
	if n := c.Running(); n != 1 {
		t.Fatalf("%d background calls during the pause, want the give-back", n)
	}
	_ = rdb.Close()
	redistest.Eventually(t, 2*time.Second, "the give-back to stop on the closed client", func() bool { return c.Running() == 0 })
}

// A Redlock give-back is done once a majority answered: with one master
// down, a give-back of a lock never taken is answered (ErrNotHeld), not
// tried again for as long as that master stays down; with a majority down
// it is unavailable.
func TestRedlockGiveBackDoneOnMajority(t *testing.T) {
	srvs, rdbs, _ := masters(t, 3)
	rl := redlockWithLast(t, rdbs, NewRedis(rdbs[2]))
	key := testKey(t)
	srvs[2].Stop()
	if err := rl.GiveBack(ctxT(t), key, "tok", time.Minute); errors.Is(err, ErrUnavailable) || !errors.Is(err, ErrNotHeld) {
		t.Fatalf("give-back with 2 of 3 masters answering: %v, want ErrNotHeld", err)
	}
	for i := range 2 {
		if n := rdbs[i].Exists(ctxT(t), GoneKey(key, "tok")).Val(); n != 1 {
			t.Fatalf("master %d has no give-back mark", i)
		}
	}
	srvs[1].Stop()
	if err := rl.GiveBack(ctxT(t), key, "tok", time.Minute); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("give-back with 1 of 3 masters answering: %v, want ErrUnavailable", err)
	}
}
