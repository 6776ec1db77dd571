package record

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

// newStoreCounting is a Store whose client records the commands it sends.
func newStoreCounting(t *testing.T, cfg engine.Config) (*Store, *redis.Client, *redistest.Commands) {
	t.Helper()
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	cmds := new(redistest.Commands)
	rdb.AddHook(cmds)
	s, err := NewStore(engine.New(rdb, &cfg))
	if err != nil {
		t.Fatal(err)
	}
	return s, rdb, cmds
}

var laterResponse = &Response{Outcome: Replayable, Status: 201, Body: []byte(`{"id":"ch_2"}`)}

// A Complete retried with a stopped lock (a lost lock's answer: its
// Context says ErrReleased); once its lease has run out and an operator
// removed the abandoned record, another request may run under the key,
// and the retry must not store over it.
func TestCompleteRetriedPastLeaseIsChecked(t *testing.T) {
	s, rdb, cmds := newStoreCounting(t, engine.Config{CallTimeout: 100 * time.Millisecond})
	ctx := ctxT(t)
	key := engine.Key("test:", "", "stale")
	stale, err := s.Begin(ctx, key, fp("a"), time.Hour, engine.Options{TTL: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	stale.Stop() // as for a lost lock's answer, tried in the background
	time.Sleep(time.Until(stale.Deadline()) + 100*time.Millisecond)
	if _, err := s.Remove(ctx, key); err != nil {
		t.Fatalf("Remove of the abandoned record: %v", err)
	}
	later, err := s.Begin(ctx, key, fp("a"), time.Hour, engine.Options{TTL: 10 * time.Second})
	if err != nil {
		t.Fatalf("a request after the stale holder's lease: %v", err)
	}
	cmds.Take()
	if err := stale.Complete(ctx, okResponse, time.Hour); !errors.Is(err, ErrNotStored) {
		t.Fatalf("the stale holder's retried Complete: %v, want ErrNotStored", err)
	}
	if sent, _ := cmds.Take(); slices.ContainsFunc(sent, func(c string) bool { return c != "evalsha" && c != "eval" }) {
		t.Fatalf("the stale holder's Complete sent %v, want complete.lua alone", sent)
	}
	if got := rdb.Get(ctx, Key(key)).Val(); got != "P"+fp("a")+later.Token() {
		t.Fatalf("the record after the stale holder's Complete: %q, want the later request's in progress", got)
	}
	if err := later.Complete(ctx, laterResponse, time.Hour); err != nil {
		t.Fatalf("the later request's Complete: %v", err)
	}
	var done *CompletedError
	if _, err := s.Begin(ctx, key, fp("a"), time.Hour, engine.Options{}); !errors.As(err, &done) || string(done.Response.Body) != string(laterResponse.Body) {
		t.Fatalf("a retry after both: %v, want the later request's answer", err)
	}
}

// The completion is checked where it runs: a request whose lock another
// request has taken in Redis (as after a Redis paused past the lease, which
// then runs what waited in its socket buffers) does not store its answer
// over the later run's, however much lease it has left by its own clock.
func TestCompleteAfterAnotherTookTheKeyIsNotStored(t *testing.T) {
	s, rdb, _ := newStoreCounting(t, engine.Config{CallTimeout: 2 * time.Second, ReleaseTimeout: time.Second})
	ctx := ctxT(t)

	key := engine.Key("test:", "", "taken")
	first, err := s.Begin(ctx, key, fp("a"), time.Hour, engine.Options{TTL: time.Minute, Renew: engine.NoRenew})
	if err != nil {
		t.Fatal(err)
	}
	// The lease is gone in Redis, the abandoned record removed (an
	// operator's DELETE) and another request runs; first's local deadline
	// is a minute away.
	rdb.Del(ctx, key, Key(key))
	later, err := s.Begin(ctx, key, fp("a"), time.Hour, engine.Options{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	// While the other holds the key, nothing is written: ErrKeyHeld.
	if err := first.Complete(ctx, okResponse, time.Hour); !errors.Is(err, ErrKeyHeld) {
		t.Fatalf("Complete of a request whose key another holds: %v, want ErrKeyHeld", err)
	}
	if err := later.Complete(ctx, laterResponse, time.Hour); err != nil {
		t.Fatal(err)
	}
	// Once the other's answer is stored, it stays: ErrNotStored, not held.
	if err := first.Complete(ctx, okResponse, time.Hour); !errors.Is(err, ErrNotStored) || errors.Is(err, ErrKeyHeld) {
		t.Fatalf("Complete after the other's answer was stored: %v, want ErrNotStored alone", err)
	}
	var done *CompletedError
	if _, err := s.Begin(ctx, key, fp("a"), time.Hour, engine.Options{}); !errors.As(err, &done) || string(done.Response.Body) != string(laterResponse.Body) {
		t.Fatalf("a retry after both: %v, want the later request's answer", err)
	}
}
