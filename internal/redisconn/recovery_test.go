package redisconn

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// A server recovers when a command succeeds after a failure to reach it;
// Redis's own error replies are answers, and successes alone wake nothing.
func TestServerHealthTellsRecovery(t *testing.T) {
	rec := newRecovery()
	s := serverHealth{recovery: rec}
	ch := rec.Watch().Recovered()
	s.report(nil)
	s.report(replyError("NOSCRIPT No matching script")) // Redis answered
	s.report(fmt.Errorf("call: %w", context.Canceled))  // the caller gave up
	s.report(redis.ErrPoolTimeout)                      // a full local pool
	s.report(nil)
	if closed(ch) || rec.Last() != 0 {
		t.Fatal("woken with no failure before")
	}
	s.report(errors.New("dial tcp: connection refused"))
	s.report(errors.New("i/o timeout"))
	if closed(ch) {
		t.Fatal("woken by a failure")
	}
	s.report(replyError("LOADING Redis is loading the dataset in memory"))
	if closed(ch) {
		t.Fatal("woken by a server still loading its data")
	}
	before := now()
	s.report(replyError("NOSCRIPT No matching script"))
	if !closed(ch) {
		t.Fatal("an answer after a failure woke nothing")
	}
	if at := rec.Last(); at < before || at > now() {
		t.Fatalf("Last %d, want the moment of the answer (after %d)", at, before)
	}
	w := rec.Watch()
	s.report(nil)
	if closed(w.Recovered()) {
		t.Fatal("woken again with no failure in between")
	}
	start := time.Now()
	if w.Wait(50 * time.Millisecond) {
		t.Fatal("woken with nothing closed")
	}
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Fatalf("waited %v with no wake-up, want its 50ms", d)
	}
}

// closed reports whether ch is closed.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// replyError is an error reply of Redis, as go-redis returns one.
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

// A Watch is ended by a recovery that came while its caller was busy (a
// try in flight) as well as by one during the wait; once woken, it waits
// for the next one.
func TestWatchWakesOnRecovery(t *testing.T) {
	rec := newRecovery()
	w := rec.Watch()
	rec.recovered() // while a try runs
	start := time.Now()
	if !w.Wait(5 * time.Second) {
		t.Fatal("a recovery before the wait did not end it")
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("woken after %v, want at once", d)
	}
	if w.Wait(10 * time.Millisecond) {
		t.Fatal("woken again by the same recovery")
	}
	go func() {
		time.Sleep(20 * time.Millisecond)
		rec.recovered()
	}()
	start = time.Now()
	if !w.Wait(5 * time.Second) {
		t.Fatal("a recovery during the wait did not end it")
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("woken after %v, want about 20ms", d)
	}
	rec.recovered()
	if w.Wait(0) {
		t.Fatal("a wait of 0 reported a wake-up: it does not wait")
	}
	if closed(w.Recovered()) {
		t.Fatal("after a wait, a recovery before it still counts")
	}
}

// Settling counts on the monotonic clock from a recovery, and never waits
// longer than SettleFor. A recovery the pools' probe tells (recovered)
// counts as one that a command's success tells.
func TestSettling(t *testing.T) {
	rec := newRecovery()
	rec.recovered()
	if d := settling(rec.Last()); d <= 0 {
		t.Fatalf("just after the probe's recovery: settling %v, want about %v", d, SettleFor)
	}
	if d := settling(0); d != 0 {
		t.Fatalf("no recovery: settling %v, want 0", d)
	}
	if d := settling(now()); d <= SettleFor-50*time.Millisecond || d > SettleFor {
		t.Fatalf("just recovered: settling %v, want about %v", d, SettleFor)
	}
	if d := settling(now() - Moment(SettleFor)); d > 0 {
		t.Fatalf("recovered SettleFor ago: settling %v, want none", d)
	}
	if d := settling(now() + Moment(time.Hour)); d != SettleFor {
		t.Fatalf("a recovery after now: settling %v, want at most %v", d, SettleFor)
	}
}

// Settle sleeps out what is left of SettleFor, and nothing without a
// recovery.
func TestSettle(t *testing.T) {
	start := time.Now()
	if !Settle(now()) {
		t.Fatal("just recovered: Settle did not sleep")
	}
	if d := time.Since(start); d < SettleFor-50*time.Millisecond {
		t.Fatalf("Settle slept %v, want about %v", d, SettleFor)
	}
	if Settle(0) {
		t.Fatal("no recovery: Settle slept")
	}
}
