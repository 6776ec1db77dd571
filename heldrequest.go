package redislock

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
)

// heldRequest is a request running under its lock, from the acquire to the
// end of its response: what the lock-only and the idempotency paths share.
// Each path says only how its lock is given back (released, or the outcome
// stored) and when.
type heldRequest struct {
	h        *Handler
	r        *http.Request
	repl     *caddy.Replacer
	lk       *engine.Lock
	hw       *holdWriter // holds back the response's end until the give-back
	acquired time.Time
	given    bool // the lock was given back
	counted  bool // the request's result was counted

	ctx       context.Context // next's, detached from the client (upstream)
	cancel    context.CancelCauseFunc
	stopAfter func() bool                // stops the watch on the client
	giveUp    atomic.Pointer[time.Timer] // runs a lease after the client left
	once      *sentOnce
}

// hold starts r's run under lk, with its result acquired and its fencing
// token set (runUnder).
func (h *Handler) hold(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, lk *engine.Lock) *heldRequest {
	h.runUnder(r, repl, lk)
	return &heldRequest{h: h, r: r, repl: repl, lk: lk, hw: newHoldWriter(w), acquired: time.Now()}
}

// giveBack gives the lock back once, with how long it was held: back does
// it and calls done when its work, in the background or not, is over.
func (q *heldRequest) giveBack(back func(done func())) {
	if q.given {
		return
	}
	q.given = true
	held := time.Since(q.acquired)
	metrics.hold.Observe(held.Seconds())
	q.h.holds.observe(held)
	back(q.h.client.done)
}

// upstream is r as next gets it: detached from the client, and sent
// upstream at most once (sendOnce). A proxy cannot stop a backend that has
// started, so a client that goes away (a browser cancelling the first POST
// of a double click, a mobile client timing out) neither cancels the
// upstream request nor frees the lock: the request runs on under its
// renewed lock, which is given back when the backend answers. It is
// cancelled when the lock is lost (lost_lock abort), and a lease after the
// client left (errClientGoneTooLong): a backend that hangs must not hold
// the key for ever. The caller defers end.
func (q *heldRequest) upstream() *http.Request {
	parent := q.lk.Context()
	if q.h.LostLock == LostLockContinue {
		parent = context.WithoutCancel(q.r.Context())
	}
	q.ctx, q.cancel = context.WithCancelCause(parent)
	ttl := time.Duration(q.h.TTL)
	q.stopAfter = context.AfterFunc(q.r.Context(), func() {
		q.giveUp.Store(time.AfterFunc(ttl, func() { q.cancel(errClientGoneTooLong) }))
	})
	req, once := sendOnce(q.r, q.ctx, q.cancel)
	q.once = once
	return req
}

// end stops what upstream started, once next has returned.
func (q *heldRequest) end() {
	if !q.stopAfter() {
		if t := q.giveUp.Load(); t != nil {
			t.Stop()
		}
	}
	q.cancel(nil)
}

// gaveUp reports whether next was cancelled a lease after its client left.
func (q *heldRequest) gaveUp() bool {
	return errors.Is(context.Cause(q.ctx), errClientGoneTooLong)
}

// unanswered reports whether next's error leaves the request's outcome
// unknown: it may have reached a backend, which never answered (a reset or
// a timeout after the request was written, a second sending stopped, a
// backend cut off a lease after its client left). Only a request no
// backend could act on (neverReached) is known not to have run.
func (q *heldRequest) unanswered(nextErr error) bool {
	return nextErr != nil && (q.once.stopped() || q.gaveUp() || !neverReached(nextErr))
}

// countUnanswered counts a request whose outcome is unknown, and logs the
// one given up a lease after its client left.
func (q *heldRequest) countUnanswered(lost bool) {
	if !lost && q.gaveUp() {
		q.h.logger.Warn("the client left a lease ago and the backend has not answered: upstream request cancelled, lock given back",
			zap.String("key", q.lk.Key()), zap.Int64("fencing_token", q.lk.Fence()))
		q.count(resultGaveUp)
		return
	}
	q.countOutcome(lost)
}

// lost reports whether the lock was lost while next ran, and why the lock's
// context ended.
func (q *heldRequest) lost() (bool, error) {
	cause := context.Cause(q.lk.Context())
	return errors.Is(cause, engine.ErrNotHeld), cause
}

// recoverPanic, deferred, gives the lock back as after a lost answer
// (giveBack, told whether the lock was lost), drops the held bytes so that
// the response stays incomplete, counts the request unless it was, and
// panics again. reverse_proxy panics with http.ErrAbortHandler when the
// upstream answer breaks off mid-body or its request is cancelled.
func (q *heldRequest) recoverPanic(giveBack func(lost bool)) {
	p := recover()
	if p == nil {
		return
	}
	lost, cause := q.lost()
	giveBack(lost)
	q.hw.discard()
	switch {
	case q.counted:
	case lost:
		q.h.lockLost(q.lk, cause)
		q.count(resultLost)
	default:
		q.count(resultAcquired)
	}
	panic(p)
}

// abort cuts off a response that has started after its lock was lost: the
// client must not see a complete-looking response.
func (q *heldRequest) abort() {
	q.count(resultLost)
	q.hw.discard()
	panic(http.ErrAbortHandler)
}

// count counts the request with result.
func (q *heldRequest) count(result string) {
	q.counted = true
	q.h.count(q.repl, result)
}

// countOutcome counts a request that ran: lost, cancelled (the client went
// away) or acquired.
func (q *heldRequest) countOutcome(lost bool) {
	switch {
	case lost:
		q.count(resultLost)
	case q.r.Context().Err() != nil:
		q.count(resultCancelled)
	default:
		q.count(resultAcquired)
	}
}

// close writes the held end of the response, once the lock was given back,
// and recycles the writer; it returns err. Last: the deferred recoverPanic
// still uses the writer until then.
func (q *heldRequest) close(err error) error {
	_ = q.hw.finish() // a failed write means the client is gone
	q.hw.free()
	return err
}
