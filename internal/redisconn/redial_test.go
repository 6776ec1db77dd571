package redisconn

// How soon a node that saw Redis go away can store an answer again once
// Redis recovers: the window in which a retry on another node may run a
// request whose answer is on its way to Redis (docs/idempotency.md,
// "Failures").

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
	"github.com/reqlock/caddy-redis-lock/internal/redistest"
	"github.com/reqlock/caddy-redis-lock/record"
)

// redialTrials restarts Redis this many times: where a restart falls in a
// redial cycle is chance, so a single one says little.
const redialTrials = 6

// TestRedialAfterRestartWithinBound: the handler's own client (a Conn, and
// engine.Client as the handler builds it) holds an answer while Redis is
// killed, tries to store it until its pool gives up dialling (more failed
// dials than its size), and keeps trying every 10ms; Redis restarts from
// its AOF. Each time, the answer must be stored within redialBound of Redis
// answering PING again, and the probe's connect must wake the tries that
// wait for Redis.
func TestRedialAfterRestartWithinBound(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, "--appendonly", "yes")
	const timeout = time.Second // the handler's default
	conn, err := Open(Options{Addresses: []string{srv.Addr}, DialTimeout: DefaultDialTimeout, Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Destruct() })
	locker := engine.NewWithBackend(conn.Backend(), &engine.Config{
		CallTimeout:    2 * timeout,
		ReleaseTimeout: timeout,
	})
	store, err := record.NewStore(locker)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const fingerprint = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	resp := &record.Response{Outcome: record.Replayable, Status: 201, Body: []byte(`{"charge":1}`)}
	poolSize := 10 * runtime.GOMAXPROCS(0) // go-redis's default, as pool_size unset

	var worst time.Duration
	for trial := range redialTrials {
		key := engine.Key(engine.DefaultPrefix, "", "redial-"+strconv.Itoa(trial))
		lk, err := store.Begin(ctx, key, fingerprint, time.Hour, engine.Options{TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		srv.Stop()
		var slowest time.Duration
		for range 3 * poolSize {
			start := time.Now()
			if err := lk.Complete(ctx, resp, time.Hour); !errors.Is(err, engine.ErrUnavailable) {
				t.Fatalf("trial %d: Complete with Redis down: %v, want ErrUnavailable", trial, err)
			}
			slowest = max(slowest, time.Since(start))
		}
		// A refused dial fails its command at once, probe or no probe: no
		// call waits out its timeout (a dial kept waiting for Redis would).
		if slowest >= timeout {
			t.Fatalf("trial %d: a completion with Redis down took %v, its whole timeout", trial, slowest)
		}
		// Restart returns once Redis answers a PING (polled every 20ms).
		woken := conn.Recovery().Watch().Recovered()
		if err := srv.Restart(); err != nil {
			t.Fatal(err)
		}
		up := time.Now()
		// The pool's probe connecting alone, with no command sent, wakes
		// the tries that wait for Redis (Recovery).
		select {
		case <-woken:
		case <-time.After(2 * time.Second):
			t.Fatalf("trial %d: the probe connected and woke nothing", trial)
		}
		for {
			err := lk.Complete(ctx, resp, time.Hour)
			if err == nil {
				break
			}
			if !errors.Is(err, engine.ErrUnavailable) || time.Since(up) > 10*time.Second {
				t.Fatalf("trial %d: Complete %v after Redis came back: %v", trial, time.Since(up), err)
			}
			time.Sleep(10 * time.Millisecond)
		}
		took := time.Since(up)
		t.Logf("trial %d: with Redis down, the slowest failed completion took %v; stored %v after Redis answered again",
			trial, slowest.Round(time.Millisecond), took.Round(time.Millisecond))
		worst = max(worst, took)
	}
	if worst > redialBound {
		t.Fatalf("an answer was stored %v after Redis came back, over the documented %v", worst, redialBound)
	}
}

// redialBound is the documented bound: the pool's probe dials every
// RedialInterval, then a connect and the round trip of the store, plus
// Restart's own PING polling (20ms), with room for a loaded machine.
const redialBound = 150 * time.Millisecond
