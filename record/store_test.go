package record

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

// fp is the fingerprint of s.
func fp(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func newStore(t *testing.T) (*Store, *redis.Client) {
	t.Helper()
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	s, err := NewStore(engine.New(rdb, &engine.Config{CallTimeout: 5 * time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	return s, rdb
}

func ctxT(t *testing.T) context.Context { return redistest.Context(t, 20*time.Second) }

var okResponse = &Response{Outcome: Replayable, Status: 201,
	Header: http.Header{"Content-Type": {"application/json"}, "X-Multi": {"a", "b"}},
	Body:   []byte(`{"id":"ch_1","amount":1299}`)}

func TestBeginCompleteReplay(t *testing.T) {
	s, rdb := newStore(t)
	ctx := ctxT(t)
	key := engine.Key("test:", "", "k1")
	lk, err := s.Begin(ctx, key, fp("a"), time.Hour, engine.Options{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if lk.Fence() <= 0 {
		t.Fatalf("fence %d", lk.Fence())
	}
	// In progress: the lock holds the token, with its lease; the record
	// holds the fingerprint and the token, for the retention.
	if got := rdb.HGetAll(ctx, key).Val(); len(got) != 1 || got[lk.Token()] == "" {
		t.Fatalf("lock in progress %v, want the token alone", got)
	}
	if p := rdb.PTTL(ctx, key).Val(); p <= 9*time.Second || p > 10*time.Second {
		t.Fatalf("lock PTTL %v, want the 10s lease", p)
	}
	if got := rdb.Get(ctx, Key(key)).Val(); got != "P"+fp("a")+lk.Token() {
		t.Fatalf("record in progress %q, want P, the fingerprint and the token", got)
	}
	if p := rdb.PTTL(ctx, Key(key)).Val(); p <= 59*time.Minute || p > time.Hour {
		t.Fatalf("record in progress PTTL %v, want the retention (1h)", p)
	}
	// A duplicate waits its turn, another request under the key is refused.
	_, err = s.Begin(ctx, key, fp("a"), time.Hour, engine.Options{TTL: 10 * time.Second})
	var ne *engine.NotObtainedError
	if !errors.As(err, &ne) || ne.Remaining <= 9*time.Second {
		t.Fatalf("duplicate in progress: %v, want NotObtained with the remaining lease", err)
	}
	if _, err := s.Begin(ctx, key, fp("b"), time.Hour, engine.Options{}); !errors.Is(err, ErrMismatch) {
		t.Fatalf("other fingerprint in progress: %v, want ErrMismatch", err)
	}

	if err := lk.Complete(ctx, okResponse, time.Hour); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(context.Cause(lk.Context()), engine.ErrReleased) {
		t.Fatalf("lock context after Complete: %v", context.Cause(lk.Context()))
	}
	if rdb.Exists(ctx, key).Val() != 0 {
		t.Fatal("lock still held after Complete")
	}
	if p := rdb.PTTL(ctx, Key(key)).Val(); p <= 59*time.Minute {
		t.Fatalf("completed record PTTL %v, want the 1h retention", p)
	}
	_, err = s.Begin(ctx, key, fp("a"), time.Hour, engine.Options{})
	var done *CompletedError
	if !errors.As(err, &done) || !reflect.DeepEqual(done.Response, okResponse) {
		t.Fatalf("after completion: %v, want the stored response %+v", err, okResponse)
	}
	if _, err := s.Begin(ctx, key, fp("b"), time.Hour, engine.Options{}); !errors.Is(err, ErrMismatch) {
		t.Fatalf("other fingerprint after completion: %v, want ErrMismatch", err)
	}
}

// A waiting duplicate gets the stored response as soon as the first request
// completes.
func TestBeginWaitEndsWithCompletion(t *testing.T) {
	s, _ := newStore(t)
	ctx := ctxT(t)
	key := engine.Key("test:", "", "wait")
	lk, err := s.Begin(ctx, key, fp("a"), time.Hour, engine.Options{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(300 * time.Millisecond)
		_ = lk.Complete(context.Background(), okResponse, time.Minute)
	}()
	start := time.Now()
	_, err = s.Begin(ctx, key, fp("a"), time.Hour, engine.Options{Wait: 5 * time.Second})
	var done *CompletedError
	if !errors.As(err, &done) || done.Response.Status != 201 {
		t.Fatalf("waiting duplicate: %v, want the stored response", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("waited %v for a completion after 300ms", d)
	}
}

// Release deletes the in-progress record with the lock: a retry runs.
func TestReleaseLetsRetryRun(t *testing.T) {
	s, rdb := newStore(t)
	ctx := ctxT(t)
	key := engine.Key("test:", "", "abandon")
	lk, err := s.Begin(ctx, key, fp("a"), time.Hour, engine.Options{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := rdb.Exists(ctx, key, Key(key)).Val(); n != 0 {
		t.Fatalf("%d keys left after Release: %v", n, rdb.HGetAll(ctx, key).Val())
	}
	lk2, err := s.Begin(ctx, key, fp("b"), time.Hour, engine.Options{TTL: 10 * time.Second})
	if err != nil {
		t.Fatalf("retry after Release: %v", err)
	}
	if lk2.Fence() <= lk.Fence() {
		t.Fatalf("fence %d after %d", lk2.Fence(), lk.Fence())
	}
	_ = lk2.Release(ctx)
}

// The keep-alive renews the record with the lock: a request longer than its
// lease still answers 422 to another fingerprint, and completes.
func TestRefreshKeepsRecord(t *testing.T) {
	s, _ := newStore(t)
	ctx := ctxT(t)
	key := engine.Key("test:", "", "long")
	lk, err := s.Begin(ctx, key, fp("a"), time.Hour, engine.Options{TTL: 600 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	if err := context.Cause(lk.Context()); err != nil {
		t.Fatalf("lock lost: %v", err)
	}
	if _, err := s.Begin(ctx, key, fp("b"), time.Hour, engine.Options{}); !errors.Is(err, ErrMismatch) {
		t.Fatalf("other fingerprint after two leases: %v, want ErrMismatch", err)
	}
	if err := lk.Complete(ctx, okResponse, time.Minute); err != nil {
		t.Fatal(err)
	}
}

// A holder whose lease ran out leaves its record abandoned: a later Begin
// takes nothing and gets ErrAbandoned, and the holder's own outcome, when
// it comes, replaces the abandoned record. Once an operator removed it and
// a newer holder runs, the stale holder's outcome is never stored over it.
func TestCompleteAfterLeaseLoss(t *testing.T) {
	s, rdb := newStore(t)
	ctx := ctxT(t)
	noRenew := engine.Options{TTL: 200 * time.Millisecond, Renew: engine.NoRenew}

	key := engine.Key("test:", "", "lost-alone")
	lk, err := s.Begin(ctx, key, fp("a"), time.Hour, noRenew)
	if err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 5*time.Second, "lease to run out", func() bool { return rdb.Exists(ctx, key).Val() == 0 })
	redistest.Eventually(t, 5*time.Second, "the lock to know it", func() bool { return lk.Context().Err() != nil })
	// The first retry to find the lease gone marks the record: in progress
	// for its own lease more, then abandoned.
	const grace = 300 * time.Millisecond
	var busy *engine.NotObtainedError
	if _, err := s.Begin(ctx, key, fp("a"), time.Hour, engine.Options{TTL: grace}); !errors.As(err, &busy) || busy.Remaining > grace || busy.Remaining < grace/2 {
		t.Fatalf("the first retry after the holder's lease ran out: %v, want NotObtained for about %v", err, grace)
	}
	time.Sleep(grace)
	if _, err := s.Begin(ctx, key, fp("a"), time.Hour, engine.Options{}); !errors.Is(err, ErrAbandoned) {
		t.Fatalf("a retry a lease after the first found the holder's lease gone: %v, want ErrAbandoned", err)
	}
	if rdb.Exists(ctx, key).Val() != 0 {
		t.Fatal("a Begin of an abandoned record took its lock")
	}
	if err := lk.Complete(ctx, okResponse, time.Minute); err != nil {
		t.Fatalf("late completion of an abandoned record: %v, want stored", err)
	}
	var done *CompletedError
	if _, err := s.Begin(ctx, key, fp("a"), time.Hour, engine.Options{}); !errors.As(err, &done) {
		t.Fatalf("after a late completion: %v", err)
	}

	key = engine.Key("test:", "", "lost-taken")
	old, err := s.Begin(ctx, key, fp("a"), time.Hour, noRenew)
	if err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 5*time.Second, "lease to run out", func() bool { return rdb.Exists(ctx, key).Val() == 0 })
	redistest.Eventually(t, 5*time.Second, "the lock to know it", func() bool { return old.Context().Err() != nil })
	if outcome, err := s.Remove(ctx, key); err != nil || outcome != Abandoned {
		t.Fatalf("Remove of the abandoned record: %c, %v; want it removed as Abandoned", outcome, err)
	}
	newer, err := s.Begin(ctx, key, fp("a"), time.Hour, engine.Options{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Complete(ctx, &Response{Outcome: Replayable, Status: 500}, time.Minute); !errors.Is(err, ErrNotStored) {
		t.Fatalf("late completion over a newer holder: %v, want ErrNotStored", err)
	}
	if got := rdb.Get(ctx, Key(key)).Val(); got != "P"+fp("a")+newer.Token() {
		t.Fatalf("the record after a stale completion: %q, want the newer holder's in progress", got)
	}
	if err := context.Cause(newer.Context()); err != nil {
		t.Fatalf("newer holder lost its lock: %v", err)
	}
	_ = newer.Release(ctx)
}

// A holder whose give-back comes late (through a failover, a healing
// partition) finds its record marked by a retry that found the lease gone,
// not yet abandoned: the give-back removes it, and the next retry runs
// instead of being told the outcome is unknown.
func TestLateGiveBackBeforeAbandoned(t *testing.T) {
	s, rdb := newStore(t)
	ctx := ctxT(t)
	key := engine.Key("test:", "", "late-give-back")
	lk, err := s.Begin(ctx, key, fp("a"), time.Hour, engine.Options{TTL: 200 * time.Millisecond, Renew: engine.NoRenew})
	if err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 5*time.Second, "lease to run out", func() bool { return rdb.Exists(ctx, key).Val() == 0 })
	var busy *engine.NotObtainedError
	if _, err := s.Begin(ctx, key, fp("a"), time.Hour, engine.Options{TTL: time.Minute}); !errors.As(err, &busy) {
		t.Fatalf("a retry that finds the lease gone: %v, want NotObtained (in progress a lease more)", err)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatalf("the late give-back: %v", err)
	}
	next, err := s.Begin(ctx, key, fp("a"), time.Hour, engine.Options{TTL: time.Minute})
	if err != nil {
		t.Fatalf("a retry after the late give-back: %v, want it to run", err)
	}
	_ = next.Release(ctx)
}

// A begin retried with its own token (the first reply was lost) gets the
// same fencing token, not a second one.
func TestBeginRetryIsIdempotent(t *testing.T) {
	s, _ := newStore(t)
	ctx := ctxT(t)
	key := engine.Key("test:", "", "retry")
	b := &begin{node: s.nodes[0], fingerprint: fp("a"), keep: time.Hour.Milliseconds()}
	f1, err := b.TryAcquire(ctx, key, "token-1", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	f2, err := b.TryAcquire(ctx, key, "token-1", time.Minute)
	if err != nil || f2 != f1 {
		t.Fatalf("retried begin: %d, %v; want %d", f2, err, f1)
	}
	if _, err := b.TryAcquire(ctx, key, "token-2", time.Minute); !errors.Is(err, engine.ErrNotObtained) {
		t.Fatalf("another token: %v, want NotObtained", err)
	}
}

// Begin of a user who may not run PEXPIRE writes nothing that outlives a
// lease (take.lua checks first).
func TestBeginLeavesNothingWithoutTTL(t *testing.T) {
	srv := redistest.Start(t)
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = admin.Close() })
	ctx := ctxT(t)
	if err := admin.Do(ctx, "acl", "setuser", "caddy", "on", ">pw", "~*", "&*", "+@all", "-pexpire").Err(); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "caddy", Password: "pw"})
	t.Cleanup(func() { _ = rdb.Close() })
	s, _ := NewStore(engine.New(rdb, nil))
	key := engine.Key("test:", "", "acl")
	if _, err := s.Begin(ctx, key, fp("a"), time.Hour, engine.Options{}); !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("Begin without PEXPIRE: %v, want ErrUnavailable", err)
	}
	if n := admin.Exists(ctx, key, Key(key)).Val(); n != 0 {
		t.Fatalf("%d keys left behind", n)
	}
}

// The same response always encodes to the same bytes (a retried completion
// compares them), whatever the order of its header map.
func TestResponseEncodingIsDeterministic(t *testing.T) {
	r := &Response{Outcome: Replayable, Status: 200, Header: http.Header{}}
	for i := range 20 {
		r.Header.Set(fmt.Sprintf("X-H%02d", i), "v")
	}
	first := encode(fp("x"), r)
	for range 50 {
		if !bytes.Equal(encode(fp("x"), r), first) {
			t.Fatal("two encodings of one response differ")
		}
	}
}

func TestResponseEncoding(t *testing.T) {
	for _, r := range []*Response{
		okResponse,
		{Outcome: NotReplayable, Status: 200, Header: http.Header{}},
		{Outcome: Unknown, Status: 502, Header: http.Header{"Content-Type": {"application/problem+json"}}, Body: []byte(`{}`)},
		{Outcome: Replayable, Status: 204, Header: http.Header{"X-Empty": {""}}, Body: []byte{}},
		{Outcome: Replayable, Status: 200, Header: http.Header{}, Body: []byte(strings.Repeat("\x00\xff", 1<<16))},
	} {
		b := encode(fp("x"), r)
		gotFP, got, err := decode(b)
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Body) == 0 && len(r.Body) == 0 {
			got.Body = r.Body
		}
		if gotFP != fp("x") || !reflect.DeepEqual(got, r) {
			t.Errorf("round trip of %+v: %+v", r, got)
		}
	}
}

// FuzzDecode: a corrupt stored record is an error, never a panic.
func FuzzDecode(f *testing.F) {
	f.Add(encode(fp("x"), okResponse))
	f.Add([]byte("C" + fp("x") + "\x01R\x00\xc8\xff\xff\xff\xff\x0f"))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, r, err := decode(b)
		if err == nil && (r == nil || r.Header == nil) {
			t.Fatal("decoded without error into nothing")
		}
	})
}

// redlockMaster is one master of a test Redlock: its server, and a client
// of its own that records what it sent.
type redlockMaster struct {
	srv  *redistest.Server
	rdb  *redis.Client
	sent *redistest.Commands
}

// newRedlockStore is a Store on a Redlock of three masters started for t.
func newRedlockStore(t *testing.T) (*Store, []redlockMaster) {
	t.Helper()
	var masters []redlockMaster
	var clients []redis.UniversalClient
	var names []string
	for range 3 {
		m := redlockMaster{srv: redistest.Start(t), sent: &redistest.Commands{}}
		m.rdb = redis.NewClient(&redis.Options{Addr: m.srv.Addr, ContextTimeoutEnabled: true, MaxRetries: 1, DialerRetries: 1})
		m.rdb.AddHook(m.sent)
		t.Cleanup(func() { _ = m.rdb.Close() })
		masters, clients, names = append(masters, m), append(clients, m.rdb), append(names, m.srv.Addr)
	}
	rl, err := engine.NewRedlock(clients, names)
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewStore(engine.NewWithBackend(rl, &engine.Config{CallTimeout: 2 * time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	return s, masters
}

// On a Redlock of three masters a record is written to all of them: a retry
// is replayed with one master down, and even from a master that alone has
// the record.
func TestRedlockRecords(t *testing.T) {
	s, masters := newRedlockStore(t)
	ctx := ctxT(t)
	key := engine.Key("test:", "", "redlock")
	lk, err := s.Begin(ctx, key, fp("a"), time.Hour, engine.Options{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Begin(ctx, key, fp("b"), time.Hour, engine.Options{}); !errors.Is(err, ErrMismatch) {
		t.Fatalf("other fingerprint in progress: %v, want ErrMismatch", err)
	}
	if err := lk.Complete(ctx, okResponse, time.Minute); err != nil {
		t.Fatal(err)
	}
	// Complete returns once a majority has it; the last master follows.
	for i, m := range masters {
		redistest.Eventually(t, 2*time.Second, fmt.Sprintf("the record on master %d", i), func() bool {
			return m.rdb.Exists(ctx, Key(key)).Val() == 1
		})
	}
	masters[0].srv.Stop()
	var done *CompletedError
	if _, err := s.Begin(ctx, key, fp("a"), time.Hour, engine.Options{}); !errors.As(err, &done) {
		t.Fatalf("retry with a master down: %v, want the stored response", err)
	}
	// Only master 2 still has it: a completed record on any master is
	// final, and the lock taken on the others meanwhile is released.
	if err := masters[1].rdb.Del(ctx, Key(key)).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Begin(ctx, key, fp("a"), time.Hour, engine.Options{}); !errors.As(err, &done) {
		t.Fatalf("retry with the record on one master: %v, want the stored response", err)
	}
	// Given back at once if master 1 answered before master 2, else once
	// it does.
	redistest.Eventually(t, 2*time.Second, "the lock taken on master 1 released", func() bool {
		return masters[1].rdb.Exists(ctx, key).Val() == 0
	})
}

// A Complete retried after its reply was lost finds its own record: stored.
func TestCompleteRetryCountsAsStored(t *testing.T) {
	s, _ := newStore(t)
	ctx := ctxT(t)
	key := engine.Key("test:", "", "complete-twice")
	lk, err := s.Begin(ctx, key, fp("a"), time.Hour, engine.Options{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Complete(ctx, okResponse, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := lk.Complete(ctx, okResponse, time.Minute); err != nil {
		t.Fatalf("second Complete of the same outcome: %v, want stored", err)
	}
	if err := lk.Complete(ctx, &Response{Outcome: Replayable, Status: 500}, time.Minute); !errors.Is(err, ErrNotStored) {
		t.Fatalf("Complete of another outcome over a stored one: %v, want ErrNotStored", err)
	}
}

// A replay on Redlock is one script per master and nothing else: a master
// that answers with the stored result took nothing, so nothing is given
// back there.
func TestRedlockReplaySendsNoRelease(t *testing.T) {
	s, masters := newRedlockStore(t)
	ctx := ctxT(t)
	key := engine.Key("test:", "", "redlock-replay")
	lk, err := s.Begin(ctx, key, fp("a"), time.Hour, engine.Options{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Complete(ctx, okResponse, time.Minute); err != nil {
		t.Fatal(err)
	}
	for i, m := range masters {
		redistest.Eventually(t, 2*time.Second, fmt.Sprintf("the record on master %d", i), func() bool {
			return m.rdb.Exists(ctx, Key(key)).Val() == 1
		})
	}
	// The first Begin's calls to a master that answered after the majority
	// (its acquire, the fencing token written back) go on in the
	// background: wait until every master has been sent nothing for a while.
	for i, m := range masters {
		quiet := 0
		redistest.Eventually(t, 5*time.Second, fmt.Sprintf("master %d quiet", i), func() bool {
			if cmds, _ := m.sent.Take(); len(cmds) > 0 {
				quiet = 0
				return false
			}
			quiet++
			return quiet >= 20
		})
	}
	var done *CompletedError
	if _, err := s.Begin(ctx, key, fp("a"), time.Hour, engine.Options{}); !errors.As(err, &done) {
		t.Fatalf("replay: %v, want the stored response", err)
	}
	time.Sleep(300 * time.Millisecond) // for anything sent in the background
	for i, m := range masters {
		// A master that never ran the script (its first Begin was cut off
		// once a majority had answered) answers NOSCRIPT, and go-redis sends
		// the script's source: still one script run.
		cmds, _ := m.sent.Take()
		// A new connection's handshake is no script run.
		cmds = slices.DeleteFunc(cmds, func(c string) bool { return c == "hello" || c == "client" })
		switch strings.Join(cmds, " ") {
		case "", "evalsha", "evalsha eval":
		default:
			t.Errorf("master %d got %v for a replay, want one script run", i, cmds)
		}
	}
}

// A Begin given back (it did not answer in time) takes nothing when it
// runs after the give-back: neither the lock nor its fingerprint is left,
// and the next Begin of the key runs at once.
func TestBeginAfterGiveBackTakesNothing(t *testing.T) {
	s, rdb := newStore(t)
	ctx := ctxT(t)
	key := engine.Key("test:", "", "given-back")
	b := &begin{node: s.nodes[0], fingerprint: fp("a"), keep: time.Hour.Milliseconds()}
	if err := b.GiveBack(ctx, key, "t1", time.Minute); !errors.Is(err, engine.ErrNotHeld) {
		t.Fatalf("give-back of a Begin that never ran: %v, want ErrNotHeld", err)
	}
	if _, err := b.TryAcquire(ctx, key, "t1", time.Minute); !errors.As(err, new(*engine.NotObtainedError)) {
		t.Fatalf("the late Begin: %v, want not obtained", err)
	}
	if n := rdb.Exists(ctx, key, Key(key)).Val(); n != 0 {
		t.Fatalf("the late Begin left %d keys (lock fields %v)", n, rdb.HGetAll(ctx, key).Val())
	}
	p, err := s.Begin(ctx, key, fp("a"), time.Hour, engine.Options{TTL: time.Minute})
	if err != nil {
		t.Fatalf("the next Begin: %v", err)
	}
	if err := p.Complete(ctx, okResponse, time.Minute); err != nil {
		t.Fatal(err)
	}
}
