package bench

import (
	"context"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
)

// BenchmarkAcquireScript is what each guarantee of the acquire script costs
// Redis: an acquire of a new key and its release, sent in pipelines of 32
// as the autopipeliner sends them under load, so that Redis's time goes to
// running the commands rather than to system calls. The figure to read is
// redis-cpu-ns/op; each variant is the shipped script with one guarantee
// taken out, measured to say where the cost is, never shipped.
//
//	set-nx-px     the floor: native SET NX PX, then a compare-and-delete script
//	shipped       internal/engine/acquire.lua, then HDEL (what the handler sends)
//	no-fence      no fencing token (a constant instead)
//	incr-fence    the token from INCR instead of the server clock, which
//	              keeps tokens increasing when a failover loses the counter
//	no-acl-check  without the check that the user may run PEXPIRE
//	no-give-back  without the check of the give-back mark
//	no-deadline   without the check of the caller's deadline on the server's
//	              clock (the shipped one is sent a deadline far ahead)
func BenchmarkAcquireScript(b *testing.B) {
	shipped := readScript(b, "../internal/redisscript/take.lua") + readScript(b, "../internal/engine/acquire.lua")
	variants := []struct{ name, old, new string }{
		{"shipped", "", ""},
		{"no-fence", "local fence = issue_fence(counter, now)", "local fence = '1'"},
		{"incr-fence", "local fence = issue_fence(counter, now)", "local fence = redis.call('INCR', counter)"},
		{"no-acl-check", "if redis.acl_check_cmd and not redis.acl_check_cmd('PEXPIRE', lock, ttl) then", "if false then"},
		{"no-give-back", "redis.call('EXISTS', lock, gone)", "redis.call('EXISTS', lock)"},
		{"no-deadline", "if deadline and deadline ~= '0' and (", "if false and ("},
	}
	rdb := newGoRedis(redisAddr)
	defer rdb.Close()
	var seq atomic.Int64
	b.Run("set-nx-px", func(b *testing.B) {
		pipelinedCycles(b, rdb, &seq, func(p redis.Pipeliner, key, token string) {
			p.SetNX(context.Background(), key, token, ttl)
		}, func(p redis.Pipeliner, key, token string) {
			p.EvalSha(context.Background(), rawRelease.Hash(), []string{key}, token)
		}, rawRelease)
	})
	for _, v := range variants {
		src := shipped
		if v.old != "" {
			if !strings.Contains(src, v.old) {
				b.Fatalf("%s: the acquire script no longer has %q", v.name, v.old)
			}
			src = strings.Replace(src, v.old, v.new, 1)
		}
		script := redis.NewScript(src)
		b.Run(v.name, func(b *testing.B) {
			pipelinedCycles(b, rdb, &seq, func(p redis.Pipeliner, key, token string) {
				p.EvalSha(context.Background(), script.Hash(), []string{key, engine.CounterKey(key), engine.GoneKey(key, token)}, token, ttl.Milliseconds(), farDeadline)
			}, func(p redis.Pipeliner, key, token string) {
				p.HDel(context.Background(), key, token)
			}, script)
		})
	}
}

// farDeadline is a deadline on the server's clock (µs) far ahead: the check
// runs, and passes.
const farDeadline = "9999999999999999"

// pipelinedCycles runs b.N acquire+release cycles of new keys, 32 acquires
// in one pipeline, then their 32 releases in another.
func pipelinedCycles(b *testing.B, rdb *redis.Client, seq *atomic.Int64, acquire, release func(p redis.Pipeliner, key, token string), scripts ...*redis.Script) {
	ctx := context.Background()
	for _, s := range scripts {
		if err := s.Load(ctx, rdb).Err(); err != nil {
			b.Fatal(err)
		}
	}
	const batch = 32
	b.ReportAllocs()
	b.SetParallelism(4)
	cpu := startCPU(b)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		keys, tokens := make([]string, 0, batch), make([]string, 0, batch)
		flush := func() {
			p := rdb.Pipeline()
			for i := range keys {
				acquire(p, keys[i], tokens[i])
			}
			cmds, err := p.Exec(ctx)
			if err == nil {
				for i := range keys {
					release(p, keys[i], tokens[i])
				}
				cmds, err = p.Exec(ctx)
			}
			if err != nil {
				b.Error(cmds, err)
			}
			keys, tokens = keys[:0], tokens[:0]
		}
		for pb.Next() {
			n := seq.Add(1)
			keys = append(keys, engine.Key(engine.DefaultPrefix, "acquire-script", strconv.FormatInt(n, 10)))
			tokens = append(tokens, uuid.NewString())
			if len(keys) == batch {
				flush()
			}
		}
		if len(keys) > 0 {
			flush()
		}
	})
	b.StopTimer()
	cpu.report()
}

func readScript(b *testing.B, path string) string {
	src, err := os.ReadFile(path)
	if err != nil {
		b.Fatal(err)
	}
	return string(src)
}
