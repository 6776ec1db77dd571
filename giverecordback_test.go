package redislock

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
	"github.com/reqlock/caddy-redis-lock/internal/redistest"
	"github.com/reqlock/caddy-redis-lock/record"
)

// A record begun for a request that did not run (its account's lock not
// taken, or begun again after a recovery) is given back even when Redis
// does not answer the first try: it is tried again once Redis answers,
// rather than left held for its lease, during which it would refuse the
// answer of an earlier holder still trying to store it.
func TestGiveRecordBackAfterRedisReturns(t *testing.T) {
	t.Parallel()
	srv, rdb := newRedis(t)
	gate := redistest.StartGate(t, srv.Addr) // the handler's way to Redis
	h := unitHandler(t, gate.Addr, func(h *Handler) {
		h.TTL = caddy.Duration(10 * time.Second)
		h.Idempotency = &IdempotencyConfig{}
		h.Redis.Timeout = caddy.Duration(200 * time.Millisecond)
	})
	ctx := context.Background()
	key := engine.Key(h.Prefix, "", "given-back")
	p, err := h.store.Begin(ctx, key, strings.Repeat("ab", 32), time.Hour, h.lockOptions())
	if err != nil {
		t.Fatal(err)
	}
	// The give-back never reaches Redis (a paused Redis would run it once
	// resumed): the connection is cut and refused.
	gate.Shut()
	err = h.giveRecordBack(ctx, p)
	if oerr := gate.Open(); oerr != nil {
		t.Fatal(oerr)
	}
	if !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("the first try with Redis cut off: %v, want ErrUnavailable", err)
	}
	if rdb.Exists(ctx, key).Val() != 1 {
		t.Fatal("the record's lock is gone already: the first try reached Redis")
	}
	resumed := time.Now()
	redistest.Eventually(t, 5*time.Second, "the record's lock given back", func() bool {
		return rdb.Exists(ctx, key).Val() == 0
	})
	t.Logf("given back %v after the way to Redis opened (lease 10s)", time.Since(resumed).Round(time.Millisecond))
	if rdb.Exists(ctx, record.Key(key)).Val() != 0 {
		t.Fatal("the record in progress was left behind: abandoned once the lease ran out")
	}
	if _, err := h.store.Begin(ctx, key, strings.Repeat("ab", 32), time.Hour, h.lockOptions()); err != nil {
		t.Fatalf("a retry's begin after the give-back: %v", err)
	}
}
