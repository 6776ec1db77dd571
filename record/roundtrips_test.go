package record

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

// A request costs Redis two round trips, as a lock does (acquire, release):
// Begin (the lock with the request's fingerprint, one script) and Complete
// (the answer stored and the lock released, one script). A retry of a
// completed request costs one: Begin, whose reply
// is the stored answer. A request given up costs two too: Begin and
// Release (HDEL). Checked on the client (a hook that sees
// every command and pipeline) and on the server (INFO commandstats), with a
// plain client and through the deferred autopipeliner the Caddy handler uses.
// Once the scripts are loaded: after a Redis restart or a SCRIPT FLUSH the
// first call of each script adds one (EVALSHA answered NOSCRIPT, then EVAL).
func TestRoundTripsPerRequest(t *testing.T) {
	srv := redistest.Start(t)
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = admin.Close() })

	for _, client := range []string{"plain", "autopipeline"} {
		t.Run("client="+client, func(t *testing.T) {
			s, hook := countedStore(t, srv.Addr, client == "autopipeline")
			ctx := ctxT(t)
			opt := engine.Options{TTL: time.Minute}
			key := func(i int) string { return engine.Key("test:", client, strconv.Itoa(i)) }
			execute := func(k string) error {
				lk, err := s.Begin(ctx, k, fp("a"), time.Hour, opt)
				if err != nil {
					return fmt.Errorf("Begin of a new key: %w", err)
				}
				return lk.Complete(ctx, okResponse, time.Hour)
			}
			replay := func(k string) error {
				var done *CompletedError
				if _, err := s.Begin(ctx, k, fp("a"), time.Hour, opt); !errors.As(err, &done) {
					return fmt.Errorf("Begin of a completed key: %v, want its stored answer", err)
				}
				return nil
			}
			giveUp := func(k string) error {
				lk, err := s.Begin(ctx, k, fp("a"), time.Hour, opt)
				if err != nil {
					return fmt.Errorf("Begin of a new key: %w", err)
				}
				return lk.Release(ctx)
			}

			// Warm-up: open the connection and load the scripts.
			if err := execute(key(-1)); err != nil {
				t.Fatal(err)
			}
			if err := replay(key(-1)); err != nil {
				t.Fatal(err)
			}
			if err := giveUp(key(-2)); err != nil {
				t.Fatal(err)
			}
			hook.Take()
			if err := admin.ConfigResetStat(ctx).Err(); err != nil {
				t.Fatal(err)
			}

			const n = 5
			for _, tc := range []struct {
				what  string
				op    func(string) error
				keys  int // key(keys+i) for the i-th request
				trips int
				want  []string
			}{
				{"executed request (Begin, Complete)", execute, 0, 2, []string{"evalsha", "evalsha"}},
				{"replay (Begin of a completed key)", replay, 0, 1, []string{"evalsha"}},
				{"request given up (Begin, Release)", giveUp, 100, 2, []string{"evalsha", "evalsha"}},
			} {
				want := tc.want
				for i := range n {
					if err := tc.op(key(tc.keys + i)); err != nil {
						t.Fatalf("%s %d: %v", tc.what, i, err)
					}
					cmds, trips := hook.Take()
					if trips != tc.trips || !slices.Equal(cmds, want) {
						t.Fatalf("%s %d: %d round trips sending %v, want %d sending %v", tc.what, i, trips, cmds, tc.trips, want)
					}
				}
				t.Logf("%s: %d round trip(s), sending %v", tc.what, tc.trips, want)
			}
			checkServerCalls(t, srv.Addr, n)
		})
	}
}

// countedStore is a Store on the Redis at addr, through a client whose
// commands and round trips hook counts, or (autopipeline) through that
// client's deferred autopipeliner.
func countedStore(t *testing.T, addr string, autopipeline bool) (*Store, *redistest.Commands) {
	t.Helper()
	hook := &redistest.Commands{}
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	rdb.AddHook(hook)
	t.Cleanup(func() { _ = rdb.Close() })
	var c redis.UniversalClient = rdb
	if autopipeline {
		ap, err := rdb.AsyncAutoPipelineWithOptions(redis.DefaultBlockingAutoPipelineOptions())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ap.Close() })
		c = ap
	}
	s, err := NewStore(engine.New(c, &engine.Config{CallTimeout: 5 * time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	return s, hook
}

// checkServerCalls checks that the server agrees with the client's count
// of n requests of each kind: a script per Begin (n executed, n replays, n
// given up), per completion and per give-up; two SETs per new lock in the
// Begin script (its fencing counter, the record in progress) and one per
// completion; an HDEL per completion and per give-up, a DEL of the record
// per give-up; and no EVAL (the scripts stayed cached).
func checkServerCalls(t *testing.T, addr string, n int) {
	t.Helper()
	for cmd, want := range map[string]int{"evalsha": 5 * n, "set": 2*2*n + n, "hdel": 2 * n, "del": n} {
		if got := redistest.Calls(t, addr, cmd); got != want {
			t.Fatalf("server saw %d %s, want %d", got, strings.ToUpper(cmd), want)
		}
	}
	if got := redistest.Calls(t, addr, "eval"); got != 0 {
		t.Fatalf("server saw %d EVAL, want 0", got)
	}
}
