package main

import (
	"fmt"
	"os"

	"github.com/alicebob/miniredis/v2"

	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

// redisKind says where the demo's Redis comes from.
type redisKind string

const (
	redisExisting redisKind = "existing" // REDIS_ADDR
	redisProcess  redisKind = "redis-server"
	redisEmbedded redisKind = "embedded"
)

// demoRedis is the Redis the locked route uses, and how to stop it.
type demoRedis struct {
	Addr  string
	Kind  redisKind
	About string // one line for the user
	close func()
}

// Close stops a Redis the demo started; an existing one is left alone.
func (r *demoRedis) Close() {
	if r.close != nil {
		r.close()
		r.close = nil
	}
}

// startRedis picks the demo's Redis: REDIS_ADDR when set, else a
// redis-server from PATH on a free port, else an in-process Redis-protocol
// server (miniredis). forceEmbedded skips the first two, so tests can
// exercise the fallback on a machine that has redis-server.
func startRedis(forceEmbedded bool) (*demoRedis, error) {
	if addr := os.Getenv("REDIS_ADDR"); addr != "" && !forceEmbedded {
		return &demoRedis{Addr: addr, Kind: redisExisting,
			About: fmt.Sprintf("existing Redis at %s (from REDIS_ADDR; keys under %s: locks expire, stored responses after %s, one fencing counter %sfence stays)",
				addr, demoPrefix, demoRetention, demoPrefix)}, nil
	}
	if redistest.Available() && !forceEmbedded {
		s, err := redistest.Launch()
		if err != nil {
			return nil, err
		}
		return &demoRedis{Addr: s.Addr, Kind: redisProcess, close: s.Close,
			About: fmt.Sprintf("redis-server from PATH, started on %s (stopped when the demo ends)", s.Addr)}, nil
	}
	return startEmbedded()
}

// startEmbedded runs miniredis in this process. It runs the lock's Lua
// scripts (EVALSHA, TIME, HSET, PEXPIRE) and HDEL, and the idempotency
// records' (GETRANGE, SET PX, PTTL, binary values), and with ClockTTL its
// TTLs follow the wall clock as a real server's do; without it a lease would
// never expire.
func startEmbedded() (*demoRedis, error) {
	m := miniredis.NewMiniRedis()
	m.ClockTTL(true)
	if err := m.Start(); err != nil {
		return nil, fmt.Errorf("embedded redis: %w", err)
	}
	about := fmt.Sprintf("embedded Redis-protocol server (miniredis) at %s: "+
		"for demos and tests only, not a Redis for production", m.Addr())
	if !redistest.Available() {
		about += "; install redis-server to run the demo on real Redis"
	}
	return &demoRedis{Addr: m.Addr(), Kind: redisEmbedded, close: m.Close, About: about}, nil
}
