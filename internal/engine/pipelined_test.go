package engine

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// paths counts how a client's commands go out: alone (ProcessHook) or in
// a pipeline (ProcessPipelineHook, as the autopipeliner sends them).
type paths struct{ alone, piped atomic.Int64 }

func (p *paths) DialHook(next redis.DialHook) redis.DialHook { return next }

func (p *paths) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		p.alone.Add(1)
		return next(ctx, cmd)
	}
}

func (p *paths) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		p.piped.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// A lone caller's commands go on the client itself, one round trip each
// with no autopipeliner between; concurrent callers' commands share the
// autopipeliner's round trips. Either way each lock is taken, kept
// exclusive, and released.
func TestPipelinedRedisSendsLoneCallsAlone(t *testing.T) {
	srv, _ := startRedis(t)
	ap, base := asyncPair(t, srv.Addr)
	var p paths
	base.AddHook(&p)
	c := NewWithBackend(NewPipelinedRedis(ap, base, Replication{}), &Config{CallTimeout: 2 * time.Second})
	ctx := ctxT(t)
	// The first cycle also dials (HELLO, CLIENT SETINFO) and loads the
	// script (EVAL after NOSCRIPT).
	mustAcquire(t, c, testKey(t)+"-warm", Options{Renew: NoRenew}).Release(ctx)
	p.alone.Store(0)
	p.piped.Store(0)

	for i := range 20 {
		l, err := c.Acquire(ctx, fmt.Sprintf("%s-%d", testKey(t), i), Options{TTL: time.Minute, Renew: NoRenew})
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if alone, piped := p.alone.Swap(0), p.piped.Swap(0); alone != 40 || piped != 0 {
		t.Fatalf("20 lone acquires and releases: %d commands alone, %d piped; want 40 and 0", alone, piped)
	}

	// 32 callers at once on 4 keys: each key has one holder at a time.
	var holders [4]atomic.Int32
	var wg sync.WaitGroup
	var taken, overlaps atomic.Int64
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				k := g % 4
				l, err := c.Acquire(ctx, fmt.Sprintf("%s-shared-%d", testKey(t), k), Options{TTL: time.Minute, Renew: NoRenew, Wait: 10 * time.Second})
				if err != nil {
					t.Error(err)
					return
				}
				if holders[k].Add(1) != 1 {
					overlaps.Add(1)
				}
				taken.Add(1)
				holders[k].Add(-1)
				if err := l.Release(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if n := taken.Load(); n != 32*50 {
		t.Fatalf("%d of %d locks taken", n, 32*50)
	}
	if n := overlaps.Load(); n != 0 {
		t.Fatalf("%d times two callers held one key", n)
	}
	if piped := p.piped.Load(); piped == 0 {
		t.Fatalf("32 concurrent callers: %d commands alone, none piped", p.alone.Load())
	}
	t.Logf("32 concurrent callers: %d commands alone, %d piped", p.alone.Load(), p.piped.Load())
}
