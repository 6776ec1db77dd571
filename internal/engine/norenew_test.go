package engine

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Without keep-alive the lock's Context ends at the local deadline, sent +
// ttl - margin, not a full ttl after the acquire: by sent + ttl Redis may
// have expired the key and another holder taken it, and a holder that
// still counts on its lease then runs beside it. TestNoRenewExpiresAtDeadline
// checks the Deadline's value; this checks when the Context ends. A 10s ttl
// has a margin of 102ms, so that a timer that fires late on a busy machine
// still ends the Context before sent + ttl.
func TestNoRenewContextEndsAtDeadline(t *testing.T) {
	_, rdb := startRedis(t)
	ctx := ctxT(t)
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	c := New(rdb, nil)
	const ttl = 10 * time.Second
	margin := leaseMargin(ttl)
	before := time.Now()
	l := mustAcquire(t, c, testKey(t), Options{TTL: ttl, Renew: NoRenew})
	d := l.Deadline()
	if !waitDone(t, l.Context(), ttl+5*time.Second) {
		t.Fatal("no-renew lock still live 5s past its ttl")
	}
	ended := time.Now()
	if cause := context.Cause(l.Context()); !errors.Is(cause, ErrLeaseExpired) {
		t.Fatalf("cause = %v, want ErrLeaseExpired", cause)
	}
	if ended.Before(d) {
		t.Fatalf("context ended %v before the deadline", d.Sub(ended))
	}
	// The acquire was sent at or after before: its lease ends in Redis no
	// earlier than before + ttl, and the Context must have ended by then.
	if limit := before.Add(ttl); !ended.Before(limit) {
		t.Fatalf("context ended %v after the deadline, at or past sent + ttl (%v after it): want it to end at the deadline, ttl - %v after sent",
			ended.Sub(d), ended.Sub(limit), margin)
	}
	t.Logf("context ended %v after the deadline (margin %v)", ended.Sub(d), margin)
}

// The deadline counts from when the acquire was sent, not from when its
// reply came: a reply held up (here by a paused Redis) eats into the lease,
// and a no-renew lock's Context ends at sent + ttl - margin all the same.
func TestNoRenewSlowReplyEndsAtDeadline(t *testing.T) {
	srv, rdb := startRedis(t)
	ctx := ctxT(t)
	if err := rdb.Ping(ctx).Err(); err != nil { // the connection, before the pause
		t.Fatal(err)
	}
	c := New(rdb, nil)
	const ttl, delay = time.Second, 400 * time.Millisecond
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	resumed := time.AfterFunc(delay, func() { _ = srv.Resume() })
	t.Cleanup(func() {
		if resumed.Stop() {
			_ = srv.Resume()
		}
	})
	before := time.Now()
	l := mustAcquire(t, c, testKey(t), Options{TTL: ttl, Renew: NoRenew})
	replied := time.Now()
	if replied.Sub(before) < delay/2 {
		t.Fatalf("the acquire was answered %v after it was sent, want the pause (%v) in between", replied.Sub(before), delay)
	}
	d := l.Deadline()
	if hi := replied.Add(ttl - leaseMargin(ttl)); !d.Before(hi) {
		t.Fatalf("Deadline %v is counted from the reply, want from the send (%v earlier)", d, replied.Sub(before))
	}
	if !waitDone(t, l.Context(), ttl+5*time.Second) {
		t.Fatal("no-renew lock still live 5s past its ttl")
	}
	ended := time.Now()
	if ended.Before(d) {
		t.Fatalf("context ended %v before the deadline", d.Sub(ended))
	}
	// The pause puts a full ttl after the reply at least delay past the
	// deadline; half of it is slack for a late timer.
	if limit := d.Add(delay / 2); ended.After(limit) {
		t.Fatalf("context ended %v after the deadline (the reply came %v after the send): want it to end at the deadline",
			ended.Sub(d), replied.Sub(before))
	}
	t.Logf("reply %v after the send; context ended %v after the deadline", replied.Sub(before), ended.Sub(d))
}
