package engine

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

// startRedis starts a real redis-server for t and returns it with a client.
func startRedis(t testing.TB) (*redistest.Server, *redis.Client) {
	t.Helper()
	srv := redistest.Start(t)
	return srv, newRDB(t, srv.Addr)
}

// newRDB returns a go-redis client that honours context deadlines, as New's
// documentation asks, closed when t ends.
func newRDB(t testing.TB, addr string, hooks ...redis.Hook) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{
		Addr:                  addr,
		ContextTimeoutEnabled: true,
		DialTimeout:           time.Second,
	})
	for _, h := range hooks {
		rdb.AddHook(h)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// ctxT is a context for one test step, generous so a busy machine never
// trips it, cancelled when t ends.
func ctxT(t testing.TB) context.Context {
	return redistest.Context(t, 20*time.Second)
}

// waitDone waits up to d for ctx to end and returns how long that took.
func waitDone(t testing.TB, ctx context.Context, d time.Duration) bool {
	t.Helper()
	select {
	case <-ctx.Done():
		return true
	case <-time.After(d):
		return false
	}
}

// mustAcquire acquires key or fails the test.
func mustAcquire(t testing.TB, c *Client, key string, opt Options) *Lock {
	t.Helper()
	l, err := c.Acquire(ctxT(t), key, opt)
	if err != nil {
		t.Fatalf("Acquire(%s): %v", key, err)
	}
	t.Cleanup(func() { _ = l.Release(context.Background()) })
	return l
}

// testKey is a lock key unique to t.
func testKey(t testing.TB) string {
	return Key("test:", "lock", t.Name())
}

// holdAs writes key as the lock of another holder with token, in the layout
// acquire.lua writes (a hash whose one field is the token), as a takeover
// after expiry would.
func holdAs(t testing.TB, rdb *redis.Client, key, token string, ttl time.Duration) {
	t.Helper()
	ctx := ctxT(t)
	if _, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Del(ctx, key)
		p.HSet(ctx, key, token, "1")
		p.PExpire(ctx, key, ttl)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// holderOf returns the token that holds key, "" when the key is absent.
func holderOf(t testing.TB, rdb *redis.Client, key string) string {
	t.Helper()
	tokens, err := rdb.HKeys(ctxT(t), key).Result()
	if err != nil || len(tokens) > 1 {
		t.Fatalf("HKEYS %s = %v, %v; want at most one holder", key, tokens, err)
	}
	if len(tokens) == 0 {
		return ""
	}
	return tokens[0]
}
