package redislock

// Acceptance tests of the redis_lock handler through Caddy itself (an
// in-process Caddy loaded from a Caddyfile, see harness_test.go), against a
// real redis-server: the rows of the README's responses table, fencing
// tokens, placeholders, release, metrics, reloads and handle_errors.

import (
	"sync"
)

// gate is a backend behaviour that blocks the first n requests until opened
// (or until their context ends), so that a test controls how long a lock is
// held.
type gate struct {
	once sync.Once
	ch   chan struct{}
}

func newGate() *gate { return &gate{ch: make(chan struct{})} }

func (g *gate) open() { g.once.Do(func() { close(g.ch) }) }
