package redislock

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/reqlock/caddy-redis-lock/lock"
)

// heldRequest is a request running under its lock, from the acquire to the
// end of its response: what the lock-only and the idempotency paths share.
// Each path says only how its lock is given back (released, or the outcome
// stored) and when.
type heldRequest struct {
	h        *Handler
	r        *http.Request
	repl     *caddy.Replacer
	lk       *lock.Lock
	hw       *holdWriter // holds back the response's end until the give-back
	acquired time.Time
	given    bool // the lock was given back
	counted  bool // the request's result was counted
}

// hold starts r's run under lk, with its result acquired and its fencing
// token set (runUnder).
func (h *Handler) hold(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, lk *lock.Lock) *heldRequest {
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

// lost reports whether the lock was lost while next ran, and why the lock's
// context ended.
func (q *heldRequest) lost() (bool, error) {
	cause := context.Cause(q.lk.Context())
	return errors.Is(cause, lock.ErrNotHeld), cause
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
