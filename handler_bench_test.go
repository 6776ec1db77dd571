package redislock

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/reqlock/caddy-redis-lock/internal/floor"
	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

// BenchmarkHandler is the handler's own cost per request, in this process
// and in Redis, without Caddy's server, an upstream or a network client
// around it: ServeHTTP with a next that answers 108 bytes of JSON, as the
// load test's upstream does. A load test through Caddy moves by ±10% from
// one run to the next on a shared 2-core machine; CPU time and allocations
// per request here move far less, so a change to the request path shows.
//
//	none         next alone, without the handler: the harness's own cost
//	floor        the load test's floor (internal/floor): SET NX PX before
//	             next, a compare-and-delete script after it, nothing more
//	lock         redis_lock, a new key per request (acquire, release)
//	idempotency  redis_lock + idempotency, a new key per request (begin, complete)
//	replay       a retry of a stored answer (begin, whose reply is the answer)
func BenchmarkHandler(b *testing.B) {
	srv := redistest.Start(b)
	for _, mode := range []string{"none", "floor", "lock", "idempotency", "replay"} {
		b.Run(mode, func(b *testing.B) {
			var h caddyhttp.MiddlewareHandler // nil: next alone
			switch mode {
			case "none":
			case "floor":
				h = floorHandler(b, srv.Addr)
			default:
				h = unitHandler(b, srv.Addr, func(h *Handler) {
					if mode != "lock" {
						h.Idempotency = &IdempotencyConfig{Retention: caddy.Duration(time.Hour)}
					}
				})
			}
			prefix := mode + strconv.FormatInt(time.Now().UnixNano(), 36) + "-"
			var stored int
			if mode == "replay" {
				stored = 1024
				for i := range stored {
					if code := serveBench(h, prefix+strconv.Itoa(i)); code != http.StatusOK {
						b.Fatalf("storing answer %d: status %d", i, code)
					}
				}
			}
			var seq atomic.Int64
			var bad atomic.Int64
			cpu0, redis0 := selfCPU(), procCPU(srv.PID())
			b.ReportAllocs()
			b.SetParallelism(16)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					n := seq.Add(1)
					if stored > 0 {
						n %= int64(stored)
					}
					if serveBench(h, prefix+strconv.FormatInt(n, 10)) != http.StatusOK {
						bad.Add(1)
					}
				}
			})
			b.StopTimer()
			if n := bad.Load(); n > 0 {
				b.Fatalf("%d of %d requests not answered 200", n, b.N)
			}
			b.ReportMetric(float64(selfCPU()-cpu0)/float64(b.N), "cpu-ns/op")
			if redis1 := procCPU(srv.PID()); redis0 >= 0 && redis1 >= 0 {
				b.ReportMetric(float64(redis1-redis0)/float64(b.N), "redis-cpu-ns/op")
			}
		})
	}
}

// benchAnswer is the load test upstream's answer (tools/loadupstream -size 108).
var benchAnswer = []byte(`{"ok":true,"pad":"` + strings.Repeat("x", 108-len(`{"ok":true,"pad":""}`)) + `"}`)

// benchNext answers benchAnswer.
var benchNext = caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error {
	w.Header().Set("Content-Type", "application/json")
	_, err := w.Write(benchAnswer)
	return err
})

// serveBench sends one POST with Idempotency-Key key through h, and returns
// the status the client got. The request's context is cancellable, as
// net/http's server makes it: contexts derived from it register with it.
func serveBench(h caddyhttp.MiddlewareHandler, key string) int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://127.0.0.1/checkout", http.NoBody)
	if err != nil {
		return http.StatusInternalServerError
	}
	r.Header.Set("Idempotency-Key", key)
	caddyhttp.NewTestReplacer(r)
	w := &discardWriter{header: http.Header{}}
	if h == nil {
		err = benchNext.ServeHTTP(w, r)
	} else {
		err = h.ServeHTTP(w, r, benchNext)
	}
	if err != nil {
		return http.StatusInternalServerError
	}
	if w.status == 0 {
		return http.StatusOK
	}
	return w.status
}

// floorHandler is the load test's floor handler on the Redis at addr.
func floorHandler(b *testing.B, addr string) *floor.Handler {
	f := &floor.Handler{Address: addr}
	if err := f.Provision(caddy.Context{}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = f.Cleanup() })
	return f
}

// discardWriter is a ResponseWriter that keeps only the status.
type discardWriter struct {
	header http.Header
	status int
}

func (w *discardWriter) Header() http.Header { return w.header }
func (w *discardWriter) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
}
func (w *discardWriter) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return len(p), nil
}

// selfCPU is this process's user+system CPU time in ns.
func selfCPU() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// procCPU is the user+system CPU time of process pid in ns, from /proc, or
// -1.
func procCPU(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil || pid == 0 {
		return -1
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		return -1
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return (utime + stime) * int64(time.Second) / 100 // USER_HZ
}
