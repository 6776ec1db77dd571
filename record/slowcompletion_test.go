package record

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

// A completion that takes several leases to reach Redis (a Bulk answer
// over a slow link) keeps its lease until Redis has answered: the lock
// stays the request's, renewed on other connections, until the script
// stores the answer and deletes it, so that no other request takes the
// key and runs meanwhile, and the answer is stored.
func TestSlowCompletionKeepsLease(t *testing.T) {
	const (
		ttl  = 600 * time.Millisecond
		rate = 32_000   // bytes a second: 64 KiB take about 2s, over 3 leases
		size = 64 << 10 // Bulk
	)
	srv := redistest.Start(t)
	proxy := redistest.StartProxy(t, srv.Addr)
	slow := redis.NewClient(&redis.Options{Addr: proxy.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = slow.Close() })
	direct := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = direct.Close() })
	// The try's bound is ReleaseTimeout plus the size at 32 KiB/s: 5s.
	s, err := NewStore(engine.New(slow, &engine.Config{CallTimeout: time.Second, ReleaseTimeout: 3 * time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	rival, err := NewStore(engine.New(direct, nil))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)

	// Warm-up, unthrottled: the scripts loaded, so that the answer is
	// sent once (not again after NOSCRIPT).
	warm, err := s.Begin(ctx, engine.Key("test:", "", "warm"), fp("warm"), time.Hour, engine.Options{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Complete(ctx, okResponse, time.Hour); err != nil {
		t.Fatal(err)
	}

	key := engine.Key("test:", "", "slow")
	p, err := s.Begin(ctx, key, fp("slow"), time.Hour, engine.Options{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	resp := &Response{Outcome: Replayable, Status: 201, Body: bytes.Repeat([]byte("x"), size)}
	if !Bulk(resp) {
		t.Fatalf("a %d-byte answer is not Bulk", size)
	}
	proxy.Throttle(rate)
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- p.Complete(ctx, resp, time.Hour) }()

	// Until Redis has answered, the lock is the request's or its answer
	// is stored: never neither. A lease not renewed meanwhile ends at
	// most a ttl after the completion began; past that a rival's Begin
	// still finds the key held.
	rivalAt := start.Add(ttl + ttl/4)
	rivalTried := false
	for {
		select {
		case err := <-done:
			took := time.Since(start)
			proxy.Throttle(0)
			if err != nil {
				t.Fatalf("Complete after %v: %v", took, err)
			}
			if !rivalTried {
				t.Fatalf("Complete took %v, less than a lease (%v) and a quarter: the link was not slow enough to tell", took, ttl)
			}
			var completed *CompletedError
			if _, err := rival.Begin(ctx, key, fp("slow"), time.Hour, engine.Options{}); !errors.As(err, &completed) || !bytes.Equal(completed.Response.Body, resp.Body) {
				t.Fatalf("Begin after the completion: %v, want the stored answer", err)
			}
			t.Logf("completion took %v over a %d B/s link, with a %v lease", took, rate, ttl)
			return
		case <-time.After(10 * time.Millisecond):
		}
		held := direct.HExists(ctx, key, p.Token()).Val()
		stored := direct.GetRange(ctx, Key(key), 0, 0).Val() == "C"
		if !held && !stored {
			t.Fatalf("%v into the completion, the lock is gone with no answer stored: the lease was not kept", time.Since(start))
		}
		if !rivalTried && !stored && time.Now().After(rivalAt) {
			rivalTried = true
			other, err := rival.Begin(ctx, key, fp("slow"), time.Hour, engine.Options{TTL: time.Minute})
			var busy *engine.NotObtainedError
			if !errors.As(err, &busy) {
				if other != nil {
					_ = other.Release(ctx)
				}
				t.Fatalf("a Begin %v into the completion: %v, want the key held (not obtained)", time.Since(start), err)
			}
		}
	}
}
