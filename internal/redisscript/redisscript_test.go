package redisscript_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/caddy-redis-lock/internal/redisscript"
	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

// A call made while no other is in flight is sent on the direct client, a
// pipeline (ProcessAll) as one; a call made while one is in flight goes
// through the autopipeliner. Each client has a hook of its own, so the
// hooks tell which client sent what.
func TestLoneCallIsSentDirectly(t *testing.T) {
	srv := redistest.Start(t)
	newClient := func() (*redis.Client, *redistest.Commands) {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
		hook := &redistest.Commands{}
		rdb.AddHook(hook)
		t.Cleanup(func() { _ = rdb.Close() })
		return rdb, hook
	}
	pipelined, viaAP := newClient()
	direct, viaDirect := newClient()
	ap, err := pipelined.AsyncAutoPipelineWithOptions(redis.DefaultBlockingAutoPipelineOptions())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ap.Close() })
	c := redisscript.NewConnDirect(ap, direct)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()

	check := func(what string, hook *redistest.Commands, wantCmds []string, wantTrips int) {
		t.Helper()
		cmds, trips := hook.Take()
		if trips != wantTrips || len(cmds) != len(wantCmds) {
			t.Fatalf("%s: %d round trips sending %v, want %d sending %v", what, trips, cmds, wantTrips, wantCmds)
		}
		for i := range cmds {
			if cmds[i] != wantCmds[i] {
				t.Fatalf("%s: sent %v, want %v", what, cmds, wantCmds)
			}
		}
	}

	// Open the connections first (go-redis keeps pipelines on connections
	// of their own): their handshakes pass the hooks too.
	for _, rdb := range []*redis.Client{pipelined, direct} {
		if err := rdb.Ping(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error { return p.Ping(ctx).Err() }); err != nil {
			t.Fatal(err)
		}
	}
	viaAP.Take()
	viaDirect.Take()

	// Alone: direct, one round trip each.
	if err := c.Process(ctx, redis.NewStatusCmd(ctx, "set", "k", "v")); err != nil {
		t.Fatal(err)
	}
	check("a lone Process, on the direct client", viaDirect, []string{"set"}, 1)
	if err := c.ProcessAll(ctx, redis.NewStatusCmd(ctx, "set", "k", "v"), redis.NewIntCmd(ctx, "del", "k")); err != nil {
		t.Fatal(err)
	}
	check("a lone ProcessAll, on the direct client", viaDirect, []string{"set", "del"}, 1)
	check("lone calls, on the autopipeliner", viaAP, nil, 0)

	// One call in flight (BLPOP holds its connection until the push):
	// the next goes through the autopipeliner.
	held := make(chan error, 1)
	go func() { held <- c.Process(ctx, redis.NewStringSliceCmd(ctx, "blpop", "wake", 5)) }()
	deadline := time.Now().Add(5 * time.Second)
	for redistest.Calls(t, srv.Addr, "blpop") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("BLPOP never reached the server")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := c.Process(ctx, redis.NewIntCmd(ctx, "rpush", "wake", "x")); err != nil {
		t.Fatal(err)
	}
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	check("the call in flight, on the direct client", viaDirect, []string{"blpop"}, 1)
	check("a call while another was in flight, on the autopipeliner", viaAP, []string{"rpush"}, 1)

	// Nothing in flight again: direct again.
	if err := c.Process(ctx, redis.NewStatusCmd(ctx, "set", "k", "v")); err != nil {
		t.Fatal(err)
	}
	check("a lone Process after the overlap, on the direct client", viaDirect, []string{"set"}, 1)
}
