package record

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

// BenchmarkCompleteWhileRedisAway is one try of a 1 MiB answer's
// completion while Redis refuses connections, as the handler tries it again
// every 25ms for 10s: what each try allocates (B/op) is what an outage
// costs per answer held, 400 times over.
func BenchmarkCompleteWhileRedisAway(b *testing.B) {
	srv := redistest.Start(b)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	b.Cleanup(func() { _ = rdb.Close() })
	s, err := NewStore(engine.New(rdb, &engine.Config{CallTimeout: time.Second}))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	p, err := s.Begin(ctx, engine.Key("bench:", "", b.Name()), fp("body"), time.Hour, engine.Options{TTL: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	srv.Stop()
	resp := &Response{Status: 200, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: make([]byte, 1<<20)}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := p.Complete(ctx, resp, time.Hour); !errors.Is(err, engine.ErrUnavailable) {
			b.Fatalf("completion while Redis is away: %v, want unavailable", err)
		}
	}
}
