package redislock

import (
	"context"
	"strconv"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

// TestClientPool: handlers (and config reloads) with the same settings share
// one client; the last Cleanup closes it. Provision never contacts Redis.
func TestClientPool(t *testing.T) {
	port, err := redistest.FreePort() // nothing listens: Provision must not care
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	provision := func(password string) *Handler {
		h := &Handler{Key: "k", Redis: &RedisConfig{Addresses: []string{addr}, Password: password}}
		if err := h.Provision(ctx); err != nil {
			t.Fatalf("Provision with Redis down: %v", err)
		}
		return h
	}
	a, b, c := provision("p"), provision("p"), provision("other")
	if a.poolKey != b.poolKey || a.poolKey == c.poolKey {
		t.Fatal("same settings must share a pool entry, different ones must not")
	}
	shared, loaded, _ := clients.LoadOrNew(a.poolKey, nil)
	clients.Delete(a.poolKey)
	if !loaded {
		t.Fatal("no pooled client for the handlers' key")
	}
	rdb := shared.(*pooledClient).UniversalClient
	a.Cleanup()
	if err := rdb.Ping(context.Background()).Err(); err != nil && err.Error() == "redis: client is closed" {
		t.Fatal("client closed while another handler still uses it")
	}
	b.Cleanup()
	if err := rdb.Ping(context.Background()).Err(); err == nil || err.Error() != "redis: client is closed" {
		t.Fatalf("after the last Cleanup: ping error %v, want the client closed", err)
	}
	c.Cleanup()
	if err := a.Cleanup(); err != nil {
		t.Fatalf("a second Cleanup must be harmless: %v", err)
	}
}

func TestUnsupportedModeFailsProvision(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	for _, mode := range []string{ModeCluster, ModeSentinel, ModeRedlock} {
		h := &Handler{Key: "k", Redis: &RedisConfig{Mode: mode}}
		err := h.Provision(ctx)
		if err == nil || err.Error() != `redis_lock: redis mode "`+mode+`" is not supported yet` {
			t.Errorf("%s: Provision error %v", mode, err)
		}
		if h.poolKey != "" {
			t.Errorf("%s: a client was pooled for an unsupported mode", mode)
		}
	}
}
