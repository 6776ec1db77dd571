package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/caddy-redis-lock/internal/redisscript"
)

// arrivedLate is a context whose deadline passed long ago but that is not
// done: what an acquire looks like to Redis when a stalled connection
// delivers it after its caller gave up. Sent on it, the acquire carries a
// deadline already past on the server's clock.
type arrivedLate struct {
	context.Context
	deadline time.Time
}

func (c arrivedLate) Deadline() (time.Time, bool) { return c.deadline, true }

// An acquire that runs after the deadline it carries takes nothing: the
// script answers LATE (ErrLate, which matches ErrUnavailable), and neither
// the lock nor a fencing token is written. Its caller has given up by
// then, so a lock taken that late would be held for a lease that nobody
// renews or releases.
func TestAcquireAfterDeadlineTakesNothing(t *testing.T) {
	srv, rdb := startRedis(t)
	ctx := ctxT(t)
	// A client that does not bound its calls by the context's deadline,
	// so that the acquire is sent all the same.
	late := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = late.Close() })
	r := NewRedis(late)
	key := testKey(t)

	// Its caller gave up 2s ago: past the deadline and its margin on
	// the server's clock, whatever the offset's error.
	gone := arrivedLate{Context: ctx, deadline: time.Now().Add(-2 * time.Second)}
	_, err := r.TryAcquire(gone, key, newToken(), time.Minute)
	if !errors.Is(err, redisscript.ErrLate) || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("acquire run after its deadline: %v, want ErrLate (ErrUnavailable)", err)
	}
	if n := rdb.Exists(ctx, key, CounterKey(key)).Val(); n != 0 {
		t.Fatalf("the late acquire wrote %d of the lock and its fencing counter, want neither", n)
	}

	// The same acquire within its deadline takes the key: it was free.
	token := newToken()
	live, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := r.TryAcquire(live, key, token, time.Minute); err != nil {
		t.Fatalf("acquire within its deadline: %v", err)
	}
	if got := holderOf(t, rdb, key); got != token {
		t.Fatalf("holder %q after an acquire within its deadline, want %q", got, token)
	}
}
