package engine

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

// A waiter starts within milliseconds of the holder's release, not at its
// next poll (up to 256ms later), on one Redis, through the autopipeliner as
// the handler uses it, and on a Redlock; a release nobody waits for
// publishes nothing.
func TestWaitWokenByRelease(t *testing.T) {
	srv, rdb := startRedis(t)
	ap, err := rdb.AsyncAutoPipeline()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ap.Close() })
	_, _, rl := masters(t, 3)
	for _, tc := range []struct {
		name string
		c    *Client
	}{
		{"redis", New(rdb, nil)},
		{"autopipeliner", New(ap, nil)},
		{"redlock", rl},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Polling, a waiter's sleeps (full jitter on 8, 16, ...
			// 256ms) add up to 124 to 248ms after five, 252 to 504ms
			// after six: behind a 260ms holder it would start up to
			// 244ms after the release, about 120ms at the median.
			// Woken, it starts at once.
			var lags []time.Duration
			for i := range 7 {
				key := testKey(t) + string(rune('a'+i))
				holder := mustAcquire(t, tc.c, key, Options{TTL: time.Minute})
				released := make(chan time.Time, 1)
				go func() {
					time.Sleep(260 * time.Millisecond)
					_ = holder.Release(context.Background())
					released <- time.Now()
				}()
				l, err := tc.c.Acquire(ctxT(t), key, Options{TTL: time.Minute, Wait: 5 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				lags = append(lags, time.Since(<-released))
				_ = l.Release(ctxT(t))
			}
			slices.Sort(lags)
			t.Logf("waiter's start after the release: %v", lags)
			if p50 := lags[len(lags)/2]; p50 > 40*time.Millisecond {
				t.Errorf("median %v from the release to the waiter's start, want a wake-up, not a poll", p50)
			}
		})
	}

	// A release nobody waited for publishes nothing.
	c := New(rdb, nil)
	before := redistest.Calls(t, srv.Addr, "spublish")
	l := mustAcquire(t, c, testKey(t)+"alone", Options{TTL: time.Minute})
	if err := l.Release(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if n := redistest.Calls(t, srv.Addr, "spublish"); n != before {
		t.Errorf("a release nobody waited for published (%d SPUBLISH, was %d)", n, before)
	}
}

// A waiter whose subscription Redis refuses (a user without channel
// permissions) still gets the lock, by polling.
func TestWaitPollsWithoutSubscription(t *testing.T) {
	srv, admin := startRedis(t)
	if err := redistest.SetACLUser(ctxT(t), srv.Addr, nil, "user nochan on >pw ~* resetchannels +@all"); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "nochan", Password: "pw", ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	_ = admin
	c := New(rdb, nil)
	key := testKey(t)
	holder := mustAcquire(t, c, key, Options{TTL: time.Minute})
	go func() {
		time.Sleep(150 * time.Millisecond)
		_ = holder.Release(context.Background())
	}()
	l, err := c.Acquire(ctxT(t), key, Options{TTL: time.Minute, Wait: 5 * time.Second})
	if err != nil {
		t.Fatalf("a waiter that cannot subscribe: %v", err)
	}
	_ = l.Release(ctxT(t))
}
