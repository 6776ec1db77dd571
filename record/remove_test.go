package record

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

// Remove never touches a key whose lock is held: a request in progress
// (Begin's lock, its record in progress) and a lock-only holder of a key with a
// record are both refused with ErrHeld, the lock and the record left as
// they are. Once the lock is released the record is removed.
func TestRemoveRefusesHeldLock(t *testing.T) {
	s, rdb := newStore(t)
	ctx := ctxT(t)
	key := engine.Key("test:", "", "remove-held")

	p, err := s.Begin(ctx, key, fp("a"), time.Hour, engine.Options{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Remove(ctx, key); !errors.Is(err, ErrHeld) {
		t.Fatalf("Remove of a request in progress: %v, want ErrHeld", err)
	}
	if got := rdb.Get(ctx, Key(key)).Val(); got != "P"+fp("a")+p.Token() {
		t.Fatalf("the request in progress lost its record (%q) to Remove", got)
	}
	if err := p.Complete(ctx, okResponse, time.Hour); err != nil {
		t.Fatal(err)
	}

	// The key's lock taken again (a lock-only route on the same key) while
	// the record is there.
	holder := mustAcquireLock(t, engine.New(rdb, nil), key)
	if _, err := s.Remove(ctx, key); !errors.Is(err, ErrHeld) {
		t.Fatalf("Remove with the lock held: %v, want ErrHeld", err)
	}
	if rdb.Exists(ctx, Key(key)).Val() != 1 {
		t.Fatal("Remove refused with ErrHeld, yet deleted the record")
	}
	if tokens := rdb.HKeys(ctx, key).Val(); len(tokens) != 1 || tokens[0] != holder.Token() {
		t.Fatalf("the lock after Remove: fields %v, want the holder's token alone", tokens)
	}

	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if outcome, err := s.Remove(ctx, key); err != nil || outcome != Replayable {
		t.Fatalf("Remove once the lock is released: %c, %v; want the replayable record removed", outcome, err)
	}
	if rdb.Exists(ctx, Key(key)).Val() != 0 {
		t.Fatal("the record is still there after Remove")
	}
}

// On a Redlock a lock held on one master alone (a minority: no request
// holds the key, but one may be taking it) is enough for Remove to remove
// nothing, on any master: a record left on some masters but not others
// would still be replayed.
func TestRedlockRemoveRefusesLockOnOneMaster(t *testing.T) {
	s, masters := newRedlockStore(t)
	ctx := ctxT(t)
	key := engine.Key("test:", "", "redlock-remove-held")
	p, err := s.Begin(ctx, key, fp("a"), time.Hour, engine.Options{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Remove(ctx, key); !errors.Is(err, ErrHeld) {
		t.Fatalf("Remove of a request in progress: %v, want ErrHeld", err)
	}
	if err := p.Complete(ctx, okResponse, time.Hour); err != nil {
		t.Fatal(err)
	}
	for i, m := range masters {
		redistest.Eventually(t, 5*time.Second, fmt.Sprintf("the record on master %d, its lock released", i), func() bool {
			return m.rdb.Exists(ctx, Key(key)).Val() == 1 && m.rdb.Exists(ctx, key).Val() == 0
		})
	}

	// Another holder's lock on master 2 alone.
	held := masters[2].rdb
	if err := held.HSet(ctx, key, "another-holder", "1").Err(); err != nil {
		t.Fatal(err)
	}
	if err := held.PExpire(ctx, key, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Remove(ctx, key); !errors.Is(err, ErrHeld) {
		t.Fatalf("Remove with the lock held on one master: %v, want ErrHeld", err)
	}
	for i, m := range masters {
		if m.rdb.Exists(ctx, Key(key)).Val() != 1 {
			t.Errorf("master %d: the record was removed while master 2 holds the lock", i)
		}
	}
	if t.Failed() {
		return
	}

	if err := held.Del(ctx, key).Err(); err != nil {
		t.Fatal(err)
	}
	if outcome, err := s.Remove(ctx, key); err != nil || outcome != Replayable {
		t.Fatalf("Remove once the lock is gone: %c, %v; want the replayable record removed", outcome, err)
	}
	for i, m := range masters {
		if m.rdb.Exists(ctx, Key(key)).Val() != 0 {
			t.Errorf("master %d still has the record after Remove", i)
		}
	}
}

// mustAcquireLock takes key with c (lock-only, no record) or fails t.
func mustAcquireLock(t *testing.T, c *engine.Client, key string) *engine.Lock {
	t.Helper()
	l, err := c.Acquire(ctxT(t), key, engine.Options{TTL: time.Minute})
	if err != nil {
		t.Fatalf("Acquire(%s): %v", key, err)
	}
	return l
}
