package redislock

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"

	"github.com/reqlock/caddy-redis-lock/internal/redisconn"
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
	shared, loaded, _ := conns.LoadOrNew(a.poolKey, nil)
	conns.Delete(a.poolKey)
	if !loaded {
		t.Fatal("no pooled client for the handlers' key")
	}
	backend := shared.(*redisconn.Conn).Backend()
	try := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := backend.TryAcquire(ctx, "k", "token", time.Second)
		return err
	}
	a.Cleanup()
	if err := try(); errors.Is(err, redis.ErrClosed) {
		t.Fatal("client closed while another handler still uses it")
	}
	b.Cleanup()
	if err := try(); !errors.Is(err, redis.ErrClosed) {
		t.Fatalf("after the last Cleanup: %v, want the client closed", err)
	}
	c.Cleanup()
	if err := a.Cleanup(); err != nil {
		t.Fatalf("a second Cleanup must be harmless: %v", err)
	}
}

// Every mode provisions without contacting Redis (nothing listens on these
// addresses), and a config a mode cannot use fails validation.
func TestModesProvision(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	for _, rc := range []*RedisConfig{
		{Mode: ModeStandalone, Addresses: []string{"127.0.0.1:1"}},
		{Mode: ModeSentinel, MasterName: "m", Addresses: []string{"127.0.0.1:1", "127.0.0.1:2"}},
		{Mode: ModeCluster, Addresses: []string{"127.0.0.1:1"}},
		{Mode: ModeRedlock, Addresses: []string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"}},
	} {
		h := &Handler{Key: "k", Redis: rc, Idempotency: &IdempotencyConfig{}}
		if err := h.Provision(ctx); err != nil {
			t.Errorf("%s: Provision: %v", rc.Mode, err)
			continue
		}
		if err := h.Validate(); err != nil {
			t.Errorf("%s: Validate: %v", rc.Mode, err)
		}
		h.Cleanup()
	}
	for _, tc := range []struct {
		rc   RedisConfig
		want string
	}{
		{RedisConfig{Addresses: []string{"a:1", "b:2"}}, "standalone mode takes one address"},
		{RedisConfig{Mode: ModeSentinel, Addresses: []string{"a:1"}}, "needs master_name"},
		{RedisConfig{Mode: ModeSentinel, MasterName: "m"}, "needs the Sentinels' addresses"},
		{RedisConfig{Mode: ModeCluster}, "at least one node"},
		{RedisConfig{Mode: ModeCluster, Addresses: []string{"a:1"}, DB: 2}, "only db 0"},
		{RedisConfig{Mode: ModeRedlock, Addresses: []string{"a:1", "b:2"}}, "odd number of independent masters"},
		{RedisConfig{Mode: ModeRedlock, Addresses: []string{"a:1", "b:2", "c:3", "d:4"}}, "odd number"},
		{RedisConfig{MasterName: "m"}, "for sentinel mode"},
	} {
		if err := tc.rc.validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.rc, err, tc.want)
		}
	}
}
