package engine

import (
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

// A replicated backend's lock is on the replica when Acquire returns; with
// the replica paused, Acquire fails within the wait with an error that
// matches ErrUnavailable and ErrNotReplicated, and the lock is given back.
// A refresh the replica does not acknowledge fails the same way.
func TestReplicatedAcquire(t *testing.T) {
	master, replica := redistest.StartWithReplica(t)
	for _, tc := range []struct {
		name string
		rdb  func() redis.UniversalClient
	}{
		{"client", func() redis.UniversalClient { return newRDB(t, master.Addr) }},
		{"autopipeliner", func() redis.UniversalClient { return newRDB(t, master.Addr) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			direct := tc.rdb()
			var rdb redis.UniversalClient = direct
			if tc.name == "autopipeliner" {
				ap, err := direct.(*redis.Client).AsyncAutoPipeline()
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { ap.Close() })
				rdb = ap
			}
			const wait = 300 * time.Millisecond
			c := NewWithBackend(NewReplicatedRedis(rdb, Replication{Replicas: 1, Timeout: wait, Direct: direct}), &Config{CallTimeout: 2 * wait})
			rrdb := newRDB(t, replica.Addr)
			key := "replicated:" + tc.name
			l, err := c.Acquire(ctxT(t), key, Options{TTL: 10 * time.Second, Renew: NoRenew})
			if err != nil {
				t.Fatalf("Acquire with the replica up: %v", err)
			}
			if n, err := rrdb.Exists(ctxT(t), key).Result(); err != nil || n != 1 {
				t.Fatalf("the replica lacks the lock Acquire returned: %d, %v", n, err)
			}

			if err := replica.Pause(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = replica.Resume() })
			if err := l.Refresh(ctxT(t), 10*time.Second); !errors.Is(err, ErrNotReplicated) || !errors.Is(err, ErrUnavailable) {
				t.Errorf("Refresh with the replica paused: %v, want ErrNotReplicated and ErrUnavailable", err)
			}
			start := time.Now()
			_, err = c.Acquire(ctxT(t), key+":2", Options{TTL: 10 * time.Second})
			took := time.Since(start)
			if !errors.Is(err, ErrNotReplicated) || !errors.Is(err, ErrUnavailable) {
				t.Fatalf("Acquire with the replica paused: %v, want ErrNotReplicated and ErrUnavailable", err)
			}
			// The WAIT gives up at half the timeout, the rest being kept
			// for its reply.
			if took < wait/2*8/10 || took > wait+250*time.Millisecond {
				t.Errorf("Acquire failed after %v, want within the timeout (%v) and not before half of it", took, wait)
			}
			redistest.Eventually(t, 5*time.Second, "the unacknowledged lock given back", func() bool {
				n, err := direct.Exists(ctxT(t), key+":2").Result()
				return err == nil && n == 0
			})
			if err := replica.Resume(); err != nil {
				t.Fatal(err)
			}
			if err := l.Release(ctxT(t)); err != nil {
				t.Fatal(err)
			}
		})
	}
}
