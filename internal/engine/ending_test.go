package engine

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// A lock whose holder's own script deletes it (Ending, then the script's
// HDEL, as package record's completion) is renewed until then, however
// long that takes; a renewal that then finds it gone is no loss: OnRenew is
// not told (no not_held renewal counted), and the keep-alive ends.
func TestEndingRenewsThenEndsQuietly(t *testing.T) {
	_, rdb := startRedis(t)
	ctx := ctxT(t)
	var ok, notHeld atomic.Int64
	c := New(rdb, &Config{OnRenew: func(err error) {
		switch {
		case err == nil:
			ok.Add(1)
		case errors.Is(err, ErrNotHeld):
			notHeld.Add(1)
		}
	}})
	key := testKey(t)
	const ttl = 300 * time.Millisecond
	l := mustAcquire(t, c, key, Options{TTL: ttl})
	l.Ending()
	time.Sleep(2 * ttl)
	if err := l.Context().Err(); err != nil || holderOf(t, rdb, key) != l.Token() || ok.Load() == 0 {
		t.Fatalf("after Ending and two leases: context %v, holder %q, %d renewals: want the lock held and renewed",
			context.Cause(l.Context()), holderOf(t, rdb, key), ok.Load())
	}
	// The holder's script deletes its fields.
	if err := rdb.HDel(ctx, key, l.Token()).Err(); err != nil {
		t.Fatal(err)
	}
	if !waitDone(t, l.Context(), 2*ttl) {
		t.Fatal("the keep-alive went on after the lock was deleted")
	}
	if cause := context.Cause(l.Context()); !errors.Is(cause, ErrNotHeld) {
		t.Fatalf("cause %v, want ErrNotHeld", cause)
	}
	if n := notHeld.Load(); n != 0 {
		t.Fatalf("OnRenew told of %d not-held renewals after Ending: want none", n)
	}
	l.Stop()
}
