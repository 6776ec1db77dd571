package record

import (
	"errors"
	"testing"
	"time"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
)

// Each record script run again with its own token, as a retry after a
// lost reply runs it (go-redis's after a dropped connection, the Conn's on
// a Cluster that did not answer in time), finds what its first run did and
// changes nothing more: a retried begin gets its fencing token and its
// record in progress back, a retried give-up deletes nothing (not a later
// holder's lock or record), a retried completion counts as stored and
// leaves the record as the first stored it. This is what makes the
// Cluster's retries until the call's deadline safe.
func TestRecordScriptsRunTwice(t *testing.T) {
	s, rdb := newStore(t)
	ctx := ctxT(t)
	key := engine.Key("test:", "", "twice")
	b := &begin{node: s.nodes[0], fingerprint: fp("a"), keep: time.Hour.Milliseconds()}
	state := func() (lock map[string]string, rec, counter string) {
		return rdb.HGetAll(ctx, key).Val(), rdb.Get(ctx, Key(key)).Val(), rdb.Get(ctx, engine.CounterKey(key)).Val()
	}

	f1, err := b.TryAcquire(ctx, key, "tok-1", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	lock1, rec1, counter1 := state()
	f2, err := b.TryAcquire(ctx, key, "tok-1", time.Minute)
	lock2, rec2, counter2 := state()
	if err != nil || f2 != f1 || rec2 != rec1 || counter2 != counter1 || len(lock2) != len(lock1) || lock2["tok-1"] != lock1["tok-1"] {
		t.Fatalf("begin run twice: fence %d then %d (%v); record %q then %q; counter %s then %s; lock %v then %v",
			f1, f2, err, rec1, rec2, counter1, counter2, lock1, lock2)
	}
	if rec1 != "P"+fp("a")+"tok-1" {
		t.Fatalf("record in progress %q", rec1)
	}

	if err := b.Release(ctx, key, "tok-1"); err != nil {
		t.Fatalf("give-up: %v", err)
	}
	if err := b.Release(ctx, key, "tok-1"); !errors.Is(err, engine.ErrNotHeld) {
		t.Fatalf("give-up run twice: %v, want ErrNotHeld (nothing of the holder's left)", err)
	}
	f3, err := b.TryAcquire(ctx, key, "tok-2", time.Minute)
	if err != nil || f3 <= f1 {
		t.Fatalf("a later holder's begin: %d %v, want a token above %d", f3, err, f1)
	}
	if err := b.Release(ctx, key, "tok-1"); !errors.Is(err, engine.ErrNotHeld) {
		t.Fatalf("the first holder's give-up a third time: %v, want ErrNotHeld", err)
	}
	if lock, rec, _ := state(); lock["tok-2"] == "" || rec != "P"+fp("a")+"tok-2" {
		t.Fatalf("a late give-up touched the later holder's: lock %v, record %q", lock, rec)
	}
	if err := b.Release(ctx, key, "tok-2"); err != nil {
		t.Fatal(err)
	}

	p, err := s.Begin(ctx, key, fp("a"), time.Hour, engine.Options{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	c := completion{value: encode(fp("a"), okResponse), retention: time.Hour}
	for run := 1; run <= 2; run++ {
		stored, err := s.completeOn(ctx, 0, p.Lock, &c)
		if _, rec, _ := state(); err != nil || !stored || rec != string(c.value) {
			t.Fatalf("completion run %d: stored %v, %v; record %q", run, stored, err, rec)
		}
		if n := rdb.Exists(ctx, key).Val(); n != 0 {
			t.Fatalf("completion run %d left the lock", run)
		}
	}
}
