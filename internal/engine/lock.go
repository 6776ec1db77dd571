package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Lock is a held lock. Its Context ends when the lock is released or lost.
type Lock struct {
	c      *Client
	b      Backend // where it lives: refresh and release go there
	key    string
	token  string
	fence  int64
	ttl    time.Duration // the acquire TTL
	renew  time.Duration // <= 0: no keep-alive
	ctx    context.Context
	cancel context.CancelCauseFunc

	mu       sync.Mutex
	deadline time.Time     // local lease deadline, monotonic
	lease    time.Duration // what the keep-alive renews to: ttl, or the last Refresh's
	timer    *time.Timer   // next renewal, or the deadline when not renewing
	done     bool          // released or lost: the timer must not be re-armed
	ending   bool          // the holder's own script deletes the lock (Ending)
	inflight sync.WaitGroup
}

// leaseMargin is what a lease is cut by locally, for clock drift between this
// process and Redis and for the time the reply takes to arrive.
func leaseMargin(ttl time.Duration) time.Duration { return ttl/100 + 2*time.Millisecond }

func newLock(parent context.Context, c *Client, b Backend, key, token string, fence int64, ttl, renew time.Duration, sent time.Time) *Lock {
	ctx, cancel := context.WithCancelCause(parent)
	l := &Lock{c: c, b: b, key: key, token: token, fence: fence, ttl: ttl, renew: renew, ctx: ctx, cancel: cancel, lease: ttl}
	l.deadline = sent.Add(ttl - leaseMargin(ttl))
	// One timer per lock: it fires at the first renewal, or at the deadline
	// when not renewing, so a request shorter than that costs no goroutine.
	// The first renewal is always due before the deadline. The timer may
	// fire at once (a slow acquire reply), so l.timer is set under the
	// mutex its callbacks take before they use it.
	l.mu.Lock()
	defer l.mu.Unlock()
	if renew > 0 && renew < time.Until(l.deadline) {
		l.timer = time.AfterFunc(renew, l.tick)
	} else {
		l.renew = 0
		l.timer = time.AfterFunc(time.Until(l.deadline), l.expire)
	}
	return l
}

// Key is the Redis key of the lock.
func (l *Lock) Key() string { return l.key }

// Token is the random value that identifies this holder in Redis.
func (l *Lock) Token() string { return l.token }

// Fence is the fencing token: larger than any earlier holder's of this key.
// It is the Redis clock in microseconds when this lock was taken, or one more
// than the last token issued when that is larger: compare tokens, do not
// count them.
func (l *Lock) Fence() int64 { return l.fence }

// Context is cancelled when the lock is released or lost, or the context
// given to Acquire ends. context.Cause tells which: ErrReleased, ErrNotHeld
// (Redis reports another holder), ErrLeaseExpired (no successful refresh
// before the local lease deadline) or the parent's error.
func (l *Lock) Context() context.Context { return l.ctx }

// Deadline is the local lease deadline: the lock must be treated as lost from
// then on unless a refresh succeeds first.
func (l *Lock) Deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

// Refresh extends the lease to ttl (the acquire TTL when ttl <= 0) if the lock
// is still held, and moves the local deadline from the time it was sent.
func (l *Lock) Refresh(ctx context.Context, ttl time.Duration) error {
	if ttl <= 0 {
		ttl = l.ttl
	}
	if err := context.Cause(l.ctx); err != nil {
		return err
	}
	sent := time.Now()
	if err := l.c.refresh(ctx, l.b, l.key, l.token, ttl); err != nil {
		if errors.Is(err, ErrNotHeld) {
			l.lose(ErrNotHeld)
		}
		return err
	}
	l.setLease(sent, ttl)
	return nil
}

// setLease makes ttl the lease after a Refresh. Redis now expires the key at
// about sent+ttl, earlier or later than before, so the local deadline follows
// it both ways, and the keep-alive renews with ttl (at least every ttl/3)
// instead of putting the old lease back.
func (l *Lock) setLease(sent time.Time, ttl time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done {
		return
	}
	l.lease = ttl
	l.deadline = sent.Add(ttl - leaseMargin(ttl))
	left := max(time.Until(l.deadline), 0)
	if l.renew > 0 {
		l.renew = max(min(l.renew, ttl/3), time.Millisecond)
		left = min(left, l.renew)
	}
	l.timer.Reset(left)
}

// Release deletes the lock if it is still ours and stops the keep-alive. It
// runs detached from ctx's cancellation (the caller may be gone), bounded by
// the client's ReleaseTimeout. It is safe to call more than once; a lock
// that has expired or been taken over reports ErrNotHeld and is left alone.
func (l *Lock) Release(ctx context.Context) error {
	l.Stop()
	return l.c.release(ctx, l.b, l.key, l.token)
}

// ReleaseAsync stops the keep-alive and ends the lock's Context at once, and
// deletes the lock in the background, for a caller that must not wait on
// Redis (one answering a lost lock at its deadline). done, when not nil, is
// called with Release's result, or with ErrUnavailable when the client's
// background work is at MaxBackground and the lease is left to end the lock.
func (l *Lock) ReleaseAsync(ctx context.Context, done func(error)) {
	l.cancel(ErrReleased)
	started := l.c.Background(ctx, func(ctx context.Context) {
		l.Stop()
		err := l.c.release(ctx, l.b, l.key, l.token)
		if done != nil {
			done(err)
		}
	})
	if !started {
		l.Stop()
		if done != nil {
			done(fmt.Errorf("%w: too much background work; the lease ends the lock", ErrUnavailable))
		}
	}
}

// GiveBackLater stops the lock and gives it back in the background, tried
// again while Redis does not answer or (with replicas) does not
// acknowledge it, for at least a lease (the Client's give-back queue, as
// for an acquire that did not answer in time): for a holder whose request
// did not run and whose Release Redis did not take. No request's context
// is kept meanwhile.
func (l *Lock) GiveBackLater() {
	l.Stop()
	l.c.giveBackUntilAnswered(l.b, l.key, l.token, l.ttl)
}

// Stop ends the keep-alive and the lock's Context (cause ErrReleased), and
// waits for a refresh in flight (it ends with the context), without a call
// to Redis: for a caller whose own script deletes the lock, such as one that
// stores the request's outcome in the same step (package record), once Redis
// has answered it (Ending keeps the lease until then). Release and
// ReleaseAsync stop the lock this way first.
func (l *Lock) Stop() {
	l.mu.Lock()
	l.done = true
	l.timer.Stop()
	l.mu.Unlock()
	l.cancel(ErrReleased)
	l.inflight.Wait()
}

// Ending tells the keep-alive that the holder's own script is deleting the
// lock (package record's completion, which stores the outcome and releases
// the lock in one step). The lease is still renewed until Stop, so that it
// lasts while that script is in flight, however long a large value takes
// to reach Redis; but from now on a renewal that finds the lock gone ends
// the keep-alive quietly (cause ErrNotHeld, no OnRenew): the script's
// delete may have run first, which is no loss. Whether it ran is what the
// script's own reply says.
func (l *Lock) Ending() {
	l.mu.Lock()
	l.ending = true
	l.mu.Unlock()
}

// tick is the keep-alive: refresh, then re-arm for the next interval or, after
// a failure, retry sooner until the local deadline passes.
func (l *Lock) tick() {
	l.mu.Lock()
	if l.done || l.ctx.Err() != nil {
		// Released, lost, or the caller's context ended: renewing for a
		// caller that is gone would only fail (or hold the key) until the
		// deadline. Release still deletes the key.
		l.done = true
		l.mu.Unlock()
		return
	}
	deadline, ttl, renew := l.deadline, l.lease, l.renew
	l.inflight.Add(1)
	l.mu.Unlock()
	defer l.inflight.Done()

	if !time.Now().Before(deadline) {
		l.lose(ErrLeaseExpired)
		return
	}
	// The lease timer watches the deadline while the refresh may be stuck;
	// the refresh itself gives up at the deadline, when it is of no use.
	lease := time.AfterFunc(time.Until(deadline), l.expire)
	rctx, cancel := context.WithDeadline(l.ctx, deadline)
	sent := time.Now()
	err := l.c.refresh(rctx, l.b, l.key, l.token, ttl)
	cancel()
	lease.Stop()
	l.mu.Lock()
	quiet := l.ending && errors.Is(err, ErrNotHeld) // deleted by the holder's script
	l.mu.Unlock()
	if l.c.cfg.OnRenew != nil && l.ctx.Err() == nil && !quiet {
		l.c.cfg.OnRenew(err)
	}
	switch {
	case err == nil:
		l.extend(sent, ttl)
		l.rearm(renew)
	case errors.Is(err, ErrNotHeld):
		l.lose(ErrNotHeld)
	default:
		l.rearm(max(renew/4, 10*time.Millisecond))
	}
}

// extend moves the local deadline to sent + ttl - margin, unless a Refresh
// set another lease while this renewal was in flight.
func (l *Lock) extend(sent time.Time, ttl time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if d := sent.Add(ttl - leaseMargin(ttl)); !l.done && ttl == l.lease && d.After(l.deadline) {
		l.deadline = d
	}
}

// rearm schedules the next tick, never later than the deadline.
func (l *Lock) rearm(after time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done {
		return
	}
	if left := time.Until(l.deadline); left < after {
		after = max(left, 0)
	}
	l.timer.Reset(after)
}

// expire ends the lock at its local deadline. Without keep-alive it is the
// main timer's function and follows a deadline moved by Refresh.
func (l *Lock) expire() {
	l.mu.Lock()
	left := time.Until(l.deadline)
	if left > 0 {
		if l.renew <= 0 && !l.done {
			l.timer.Reset(left)
		}
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()
	l.lose(ErrLeaseExpired)
}

// lose ends the lock's context with cause; the keep-alive stops.
func (l *Lock) lose(cause error) {
	l.mu.Lock()
	l.done = true
	l.timer.Stop()
	l.mu.Unlock()
	l.cancel(cause)
}
