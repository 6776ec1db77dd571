package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
	"github.com/reqlock/caddy-redis-lock/internal/redistest"
	"github.com/reqlock/caddy-redis-lock/lock"
	"github.com/reqlock/caddy-redis-lock/record"
)

// The embedded server must run the lock's scripts as Redis does: EVALSHA
// with the EVAL fallback, TIME for the fencing seed, PEXPIRE renewals, and
// leases that expire on the wall clock.
func TestEmbeddedRedisRunsLockScripts(t *testing.T) {
	r, err := startEmbedded()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.Kind != redisEmbedded {
		t.Fatalf("kind %q", r.Kind)
	}
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	c := lock.New(rdb, nil)
	ctx := redistest.Context(t, 10*time.Second)
	key := lock.Key(lock.DefaultPrefix, "", "order-1")

	held, err := c.Acquire(ctx, key, lock.Options{TTL: 300 * time.Millisecond, Renew: 60 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if held.Fence() < 1_000_000_000_000_000 { // seeded from TIME in microseconds
		t.Errorf("fence %d was not seeded from the server clock", held.Fence())
	}
	var no *lock.NotObtainedError
	if _, err := c.Acquire(ctx, key, lock.Options{}); !errors.As(err, &no) || no.Remaining <= 0 {
		t.Fatalf("second acquire: %v, want NotObtained with a remaining lease", err)
	}
	time.Sleep(700 * time.Millisecond) // > 2 leases: only renewals keep it
	if err := held.Context().Err(); err != nil {
		t.Fatalf("lock lost despite renewals: %v", context.Cause(held.Context()))
	}
	if err := rdb.ScriptFlush(ctx).Err(); err != nil { // next calls must fall back to EVAL
		t.Fatal(err)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}

	short, err := c.Acquire(ctx, key, lock.Options{TTL: 150 * time.Millisecond, Renew: lock.NoRenew})
	if err != nil {
		t.Fatal(err)
	}
	if short.Fence() <= held.Fence() {
		t.Errorf("fence %d not above %d", short.Fence(), held.Fence())
	}
	// Without renewals the lease must run out on the wall clock.
	deadline := time.Now().Add(5 * time.Second)
	for {
		next, err := c.Acquire(ctx, key, lock.Options{TTL: time.Second})
		if err == nil {
			_ = next.Release(ctx)
			break
		}
		if !errors.Is(err, lock.ErrNotObtained) || time.Now().After(deadline) {
			t.Fatalf("lease never expired: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The embedded server must also run the idempotency records' commands as
// Redis does: the begin script (GETRANGE, HGETALL, PTTL beside the lock's
// take), refresh, completion (SET NX GET PX with a binary response, HDEL)
// and giving up, with records that expire on the wall clock.
func TestEmbeddedRedisRunsRecordScripts(t *testing.T) {
	r, err := startEmbedded()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	store, err := record.NewStore(engine.New(rdb, nil))
	if err != nil {
		t.Fatal(err)
	}
	ctx := redistest.Context(t, 10*time.Second)
	fp := func(s string) string {
		sum := sha256.Sum256([]byte(s))
		return hex.EncodeToString(sum[:])
	}
	key := lock.Key(demoPrefix, "", "order-1")
	opt := engine.Options{TTL: 300 * time.Millisecond, Renew: 60 * time.Millisecond}

	lk, err := store.Begin(ctx, key, fp("charge"), time.Hour, opt)
	if err != nil {
		t.Fatal(err)
	}
	var no *lock.NotObtainedError
	if _, err := store.Begin(ctx, key, fp("charge"), time.Hour, opt); !errors.As(err, &no) || no.Remaining <= 0 {
		t.Fatalf("duplicate in progress: %v, want NotObtained with a remaining lease", err)
	}
	if _, err := store.Begin(ctx, key, fp("another charge"), time.Hour, opt); !errors.Is(err, record.ErrMismatch) {
		t.Fatalf("another request under the key: %v, want ErrMismatch", err)
	}
	time.Sleep(700 * time.Millisecond) // > 2 leases: only refresh keeps the lock and its fingerprint
	if err := lk.Context().Err(); err != nil {
		t.Fatalf("lock lost despite renewals: %v", context.Cause(lk.Context()))
	}
	if _, err := store.Begin(ctx, key, fp("another charge"), time.Hour, opt); !errors.Is(err, record.ErrMismatch) {
		t.Fatalf("another request under the key after refreshes: %v, want ErrMismatch", err)
	}

	body := make([]byte, 256) // every byte value, as a compressed body has
	for i := range body {
		body[i] = byte(i)
	}
	resp := &record.Response{Outcome: record.Replayable, Status: 200,
		Header: http.Header{"Content-Type": {"application/json"}}, Body: body}
	if err := lk.Complete(ctx, resp, 400*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := rdb.ScriptFlush(ctx).Err(); err != nil { // the next begin must fall back to EVAL
		t.Fatal(err)
	}
	var done *record.CompletedError
	if _, err := store.Begin(ctx, key, fp("charge"), time.Hour, opt); !errors.As(err, &done) || !reflect.DeepEqual(done.Response, resp) {
		t.Fatalf("retry after completion: %v, want the stored response", err)
	}
	if _, err := store.Begin(ctx, key, fp("another charge"), time.Hour, opt); !errors.Is(err, record.ErrMismatch) {
		t.Fatalf("another request under a completed key: %v, want ErrMismatch", err)
	}
	// The record expires after its retention, on the wall clock.
	deadline := time.Now().Add(5 * time.Second)
	for {
		next, err := store.Begin(ctx, key, fp("another charge"), time.Hour, opt)
		if err == nil {
			lk = next
			break
		}
		if !errors.Is(err, record.ErrMismatch) || time.Now().After(deadline) {
			t.Fatalf("record never expired: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Given up (the backend never reached): the record goes, a retry runs.
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := rdb.Exists(ctx, key, record.Key(key)).Val(); n != 0 {
		t.Fatalf("%d of the lock and record keys left after Release", n)
	}
	again, err := store.Begin(ctx, key, fp("charge"), time.Hour, opt)
	if err != nil {
		t.Fatalf("begin after Release: %v", err)
	}
	if err := again.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestStartRedisChoice(t *testing.T) {
	t.Run("REDIS_ADDR", func(t *testing.T) {
		t.Setenv("REDIS_ADDR", "127.0.0.1:1")
		r, err := startRedis(false)
		if err != nil {
			t.Fatal(err)
		}
		r.Close()
		if r.Kind != redisExisting || r.Addr != "127.0.0.1:1" {
			t.Errorf("got %q at %s", r.Kind, r.Addr)
		}
	})
	t.Run("forced embedded", func(t *testing.T) {
		t.Setenv("REDIS_ADDR", "127.0.0.1:1")
		r, err := startRedis(true)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		if r.Kind != redisEmbedded {
			t.Errorf("got %q", r.Kind)
		}
	})
	t.Run("no redis-server on PATH", func(t *testing.T) {
		t.Setenv("REDIS_ADDR", "")
		t.Setenv("PATH", t.TempDir())
		r, err := startRedis(false)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		if r.Kind != redisEmbedded || !strings.Contains(r.About, "for demos and tests only") {
			t.Errorf("got %q: %s", r.Kind, r.About)
		}
	})
	t.Run("redis-server", func(t *testing.T) {
		redistest.Require(t)
		t.Setenv("REDIS_ADDR", "")
		r, err := startRedis(false)
		if err != nil {
			t.Fatal(err)
		}
		if r.Kind != redisProcess {
			t.Fatalf("got %q", r.Kind)
		}
		rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
		defer rdb.Close()
		ctx := redistest.Context(t, 5*time.Second)
		if err := rdb.Ping(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		r.Close()
		if err := rdb.Ping(ctx).Err(); err == nil {
			t.Error("redis-server still answers after Close")
		}
	})
}
