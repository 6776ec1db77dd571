package bench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
	"github.com/reqlock/caddy-redis-lock/lock"
	"github.com/reqlock/caddy-redis-lock/record"
)

// The idempotency mode's Redis side (package record), with a 1 KiB JSON
// answer and the headers an API sends with it:
//
//	op=lock     Acquire+Release of a new key: the lock-only handler's two
//	            round trips, the base the other two are compared with
//	op=execute  Begin of a new key, then Complete with the answer: a request
//	            that runs, two round trips (the record in progress with the
//	            lock; the answer stored and the lock released)
//	op=replay   Begin of a completed key: a retry, one round trip whose reply
//	            is the stored answer, decoded
//
// Shapes: serial (one goroutine), parallel (SetParallelism(32), as
// ParallelFresh) and parallel-autopipeline (the same through go-redis's
// deferred autopipeliner with the options the Caddy handler uses).

// answer is a stored response: a 1 KiB JSON body and an API's headers
// (Content-Length and Date are not stored: a replay sets them anew).
var answer = &record.Response{
	Outcome: record.Replayable,
	Status:  http.StatusCreated,
	Header: http.Header{
		"Content-Type":                {"application/json"},
		"Cache-Control":               {"no-cache, no-store"},
		"Request-Id":                  {"req_8f2kQm3ZtYv1Lx"},
		"Idempotency-Key":             {"8e03978e-40d5-43e8-bc93-6894a57f9324"},
		"Strict-Transport-Security":   {"max-age=63072000; includeSubDomains; preload"},
		"Access-Control-Allow-Origin": {"*"},
		"Vary":                        {"Origin"},
	},
	Body: jsonAnswer(1024),
}

// jsonAnswer is a payment API's charge as JSON, padded to size bytes.
func jsonAnswer(size int) []byte {
	const head = `{"id":"ch_3PqLt2eZvKYlo2C1","object":"charge","amount":1299,"amount_captured":1299,` +
		`"currency":"eur","customer":"cus_Q8xYzA1b2C3d4E","description":"Order 1042",` +
		`"payment_method":"pm_1PqLt1eZvKYlo2C1xYz","status":"succeeded","created":1796136845,` +
		`"metadata":{"order_id":"1042","note":"`
	const tail = `"}}`
	pad := max(size-len(head)-len(tail), 0)
	return []byte(head + strings.Repeat("x", pad) + tail)
}

// fingerprint is a request's fingerprint (hex SHA-256), the same for every
// key: the benchmark's requests are alike, only their keys differ.
const fingerprint = "3f0a7c1e9b2d4f6a8c0e1f2a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e"

// retention is how long an answer is kept: the handler's default.
const retention = 24 * time.Hour

// replayKeys is how many completed keys the replay benchmarks cycle through.
const replayKeys = 1024

type recordStore struct {
	close func()
	c     *engine.Client
	s     *record.Store
}

// newRecordStore is a Store on a go-redis client with the others' options,
// or (autopipeline) on its deferred autopipeliner with the handler's options.
func newRecordStore(addr string, autopipeline bool) (*recordStore, error) {
	rdb := newGoRedis(addr)
	var c redis.UniversalClient = rdb
	closeAll := func() { rdb.Close() }
	if autopipeline {
		opt := redis.DefaultBlockingAutoPipelineOptions()
		opt.MaxQueuedCommands = 10000
		ap, err := rdb.AsyncAutoPipelineWithOptions(opt)
		if err != nil {
			rdb.Close()
			return nil, err
		}
		c = ap
		closeAll = func() { ap.Close(); rdb.Close() }
	}
	lc := engine.New(c, nil)
	s, err := record.NewStore(lc)
	if err != nil {
		closeAll()
		return nil, err
	}
	return &recordStore{close: closeAll, c: lc, s: s}, nil
}

func (r *recordStore) lockCycle(ctx context.Context, key string) error {
	l, err := r.c.Acquire(ctx, key, engine.Options{TTL: ttl})
	if err != nil {
		return err
	}
	return l.Release(ctx)
}

func (r *recordStore) execute(ctx context.Context, key string) error {
	lk, err := r.s.Begin(ctx, key, fingerprint, retention, engine.Options{TTL: ttl})
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	return lk.Complete(ctx, answer, retention)
}

func (r *recordStore) replay(ctx context.Context, key string) error {
	_, err := r.s.Begin(ctx, key, fingerprint, retention, engine.Options{TTL: ttl})
	var done *record.CompletedError
	if !errors.As(err, &done) {
		return fmt.Errorf("begin of a completed key: %v, want its answer", err)
	}
	if len(done.Response.Body) != len(answer.Body) {
		return fmt.Errorf("replayed a body of %d bytes, want %d", len(done.Response.Body), len(answer.Body))
	}
	return nil
}

func BenchmarkIdempotency(b *testing.B) {
	shapes := []struct {
		name         string
		parallel     bool
		autopipeline bool
	}{
		{"serial", false, false},
		{"parallel", true, false},
		{"parallel-autopipeline", true, true},
	}
	for _, sh := range shapes {
		b.Run("shape="+sh.name, func(b *testing.B) {
			r, err := newRecordStore(redisAddr, sh.autopipeline)
			if err != nil {
				b.Fatal(err)
			}
			defer r.close()
			ctx := context.Background()
			prefix := fmt.Sprintf("bench:idem:%s:%d:", sh.name, time.Now().UnixNano())
			// The keys replayed: stored once per shape and round.
			replayKey := func(i int) string {
				return lock.Key(lock.DefaultPrefix, "", prefix+"replay:"+strconv.Itoa(i%replayKeys))
			}
			for i := range replayKeys {
				if err := r.execute(ctx, replayKey(i)); err != nil {
					b.Fatal(err)
				}
			}
			var seq atomic.Int64
			fresh := func() string {
				return lock.Key(lock.DefaultPrefix, "", prefix+strconv.FormatInt(seq.Add(1), 10))
			}
			ops := []struct {
				name string
				op   func(ctx context.Context, i int) error
			}{
				{"lock", func(ctx context.Context, _ int) error { return r.lockCycle(ctx, fresh()) }},
				{"execute", func(ctx context.Context, _ int) error { return r.execute(ctx, fresh()) }},
				{"replay", func(ctx context.Context, i int) error { return r.replay(ctx, replayKey(i)) }},
			}
			for _, o := range ops {
				b.Run("op="+o.name, func(b *testing.B) {
					for i := range 3 { // warm: scripts loaded, connections open
						if err := o.op(ctx, i); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportAllocs()
					cpu := startCPU(b)
					b.ResetTimer()
					if !sh.parallel {
						i := 0
						for b.Loop() {
							if err := o.op(ctx, i); err != nil {
								b.Fatal(err)
							}
							i++
						}
					} else {
						var start atomic.Int64
						b.SetParallelism(32)
						b.RunParallel(func(pb *testing.PB) {
							// Each goroutine starts at its own place in
							// the replay keys.
							i := int(start.Add(replayKeys / 64))
							for pb.Next() {
								if err := o.op(ctx, i); err != nil {
									b.Errorf("%s: %v", o.name, err)
									return
								}
								i++
							}
						})
					}
					b.StopTimer()
					cpu.report()
				})
			}
		})
	}
}

// recordMemoryN is how many answers TestRecordMemory stores.
const recordMemoryN = 10000

// TestRecordMemory measures what a stored answer costs Redis: it stores
// recordMemoryN answers of 1 KiB (with answer's headers) as the handler does
// (Begin, Complete, under production-like keys and the default retention)
// and prints Redis's used_memory growth per record, and MEMORY USAGE and the
// value's length of one record. bench/run.sh runs it once and prints the
// lines that start with "record-memory:".
func TestRecordMemory(t *testing.T) {
	r, admin, key := memoryStore(t, "memory")
	ctx := context.Background()
	if err := r.execute(ctx, key(-1)); err != nil { // scripts loaded, fencing counter there
		t.Fatal(err)
	}
	fencingCounters(t, admin)
	keys0 := admin.DBSize(ctx).Val()
	before := usedMemory(t, admin)

	// Stored by 16 goroutines, as concurrent requests would.
	var wg sync.WaitGroup
	var next atomic.Int64
	errs := make(chan error, 16)
	for range 16 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= recordMemoryN {
					return
				}
				if err := r.execute(ctx, key(i)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	after := usedMemory(t, admin)
	if n := admin.DBSize(ctx).Val() - keys0; n != recordMemoryN {
		t.Fatalf("%d keys more after storing %d answers, want one record each", n, recordMemoryN)
	}
	one := record.Key(key(recordMemoryN / 2))
	usage, err := admin.MemoryUsage(ctx, one, 0).Result()
	if err != nil {
		t.Fatal(err)
	}
	strlen := admin.StrLen(ctx, one).Val()
	headerBytes := 0
	for k, vs := range answer.Header {
		headerBytes += len(k)
		for _, v := range vs {
			headerBytes += len(v)
		}
	}
	perRecord := float64(after-before) / recordMemoryN
	if perRecord < float64(strlen) {
		t.Fatalf("used_memory grew %.0f bytes per record, less than the record's %d bytes", perRecord, strlen)
	}
	t.Logf("record-memory: %d answers of %d body bytes + %d header bytes (%d headers), keys of %d bytes",
		recordMemoryN, len(answer.Body), headerBytes, len(answer.Header), len(one))
	t.Logf("record-memory: used_memory +%.0f bytes per record (%.1f MiB for %d; %.0f records per GiB)",
		perRecord, float64(after-before)/(1<<20), recordMemoryN, (1<<30)/perRecord)
	t.Logf("record-memory: one record: value %d bytes, MEMORY USAGE %d bytes", strlen, usage)
}

// usedMemory is Redis's used_memory.
func usedMemory(t *testing.T, admin *redis.Client) int64 {
	t.Helper()
	info, err := admin.Info(context.Background(), "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no used_memory in INFO memory")
	return 0
}

// fencingCounters makes every fencing counter of the prefix exist (one per
// hash tag, 65,536 at most, as on a Redis that has served for a while), so
// that what is measured after is the records alone.
func fencingCounters(t *testing.T, admin *redis.Client) {
	t.Helper()
	ctx := context.Background()
	pipe := admin.Pipeline()
	for tag := range 1 << 16 {
		pipe.SetNX(ctx, fmt.Sprintf("%s{%04x}fence", lock.DefaultPrefix, tag), "1", 0)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestInProgressMemory measures what a request in progress costs Redis:
// recordMemoryN requests begun (Begin, the default retention, a lease of a
// minute) and held, and prints Redis's used_memory growth per request and
// MEMORY USAGE of one's lock and record, in lines that start with
// "in-progress-memory:". Run it alone (-run TestInProgressMemory) to compare
// two trees.
func TestInProgressMemory(t *testing.T) {
	r, admin, key := memoryStore(t, "in-progress")
	ctx := context.Background()
	if err := r.execute(ctx, key(-1)); err != nil { // scripts loaded
		t.Fatal(err)
	}
	fencingCounters(t, admin)
	before := usedMemory(t, admin)
	held := make([]*record.Pending, recordMemoryN)
	for i := range held {
		p, err := r.s.Begin(ctx, key(i), fingerprint, retention, engine.Options{TTL: time.Minute, Renew: engine.NoRenew})
		if err != nil {
			t.Fatal(err)
		}
		held[i] = p
	}
	after := usedMemory(t, admin)
	one := key(recordMemoryN / 2)
	lockUsage := admin.MemoryUsage(ctx, one, 0).Val()
	recordUsage := admin.MemoryUsage(ctx, record.Key(one), 0).Val()
	for _, p := range held {
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if lockUsage == 0 {
		t.Fatal("a request begun and held has no lock")
	}
	// used_memory's growth also counts Redis's own tables, which grow in
	// powers of two and rehash in the background: MEMORY USAGE of one
	// request's keys is the steady figure to compare.
	perRequest := float64(after-before) / recordMemoryN
	t.Logf("in-progress-memory: %d requests begun and held: used_memory +%.0f bytes per request", recordMemoryN, perRequest)
	t.Logf("in-progress-memory: one request: MEMORY USAGE lock %d bytes, record %d bytes", lockUsage, recordUsage)
}

// memoryStore is a memory test's record store and admin client on the
// benchmarks' Redis, closed when t ends, and its keys, named after what
// and the time.
func memoryStore(t *testing.T, what string) (*recordStore, *redis.Client, func(int) string) {
	t.Helper()
	r, err := newRecordStore(redisAddr, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.close)
	admin := redis.NewClient(&redis.Options{Addr: redisAddr})
	t.Cleanup(func() { admin.Close() })
	run := time.Now().UnixNano()
	return r, admin, func(i int) string {
		return lock.Key(lock.DefaultPrefix, "", fmt.Sprintf("%s-%d-%08d", what, run, i))
	}
}
