package redislock

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
	"github.com/reqlock/caddy-redis-lock/record"
)

// heldRequest is a request running under its key, from the acquire (or the
// record's begin) to the end of its response: the path both modes share.
// Its mode says only how the key is given back (giveBack). It owns the
// hold on the Redis connection, ended once the key is given back.
type heldRequest struct {
	h        *Handler
	r        *http.Request
	repl     *caddy.Replacer
	lk       *engine.Lock // the lock next runs under: its fencing token is sent
	record   *engine.Lock // the record's lock, when lk is an account's
	hw       *holdWriter  // holds back the response's end until the give-back
	back     giveBack
	unhold   func() // ends the request's hold on the Redis connection
	acquired time.Time
	given    bool // the key was given back
	counted  bool // the request's result was counted

	ctx        context.Context // next's, detached from the client (upstream)
	cancel     context.CancelCauseFunc
	stopAfter  func() bool                // stops the watch on the client
	stopRecord func() bool                // stops the watch on the record's lock
	giveUp     atomic.Pointer[time.Timer] // runs a lease after the client left
	once       *sentOnce

	// The give-backs, kept here so that choosing one allocates nothing.
	lockGB    lockGiveBack
	recordGB  recordGiveBack
	accountGB accountGiveBack
}

// hold starts r's run under lk (pending's lock, with idempotency; an
// account's, with pending's beside it, with `idempotency { key }`), with
// its result acquired and its fencing token set (runUnder). unhold ends its
// hold on the Redis connection once the key is given back.
func (h *Handler) hold(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, lk *engine.Lock, pending *record.Pending, unhold func()) *heldRequest {
	h.runUnder(r, repl, lk)
	q := &heldRequest{h: h, r: r, repl: repl, lk: lk, hw: newHoldWriter(w), unhold: unhold, acquired: time.Now()}
	switch {
	case pending != nil && pending.Lock != lk:
		q.record = pending.Lock
		q.recordGB = recordGiveBack{h: h, r: r, pending: pending}
		q.lockGB = lockGiveBack{h: h, r: r, lk: lk}
		q.accountGB = accountGiveBack{record: &q.recordGB, lock: &q.lockGB}
		q.back = &q.accountGB
	case pending != nil:
		q.recordGB = recordGiveBack{h: h, r: r, pending: pending}
		q.back = &q.recordGB
	default:
		q.lockGB = lockGiveBack{h: h, r: r, lk: lk}
		q.back = &q.lockGB
	}
	return q
}

// run calls next under the key, gives the key back before the last byte of
// the response is written, whatever next does (returns, fails, panics),
// and answers. next runs detached from the client (upstream).
func (q *heldRequest) run(next caddyhttp.Handler) error {
	defer q.recoverPanic()
	out := q.back.writer(q.hw)
	req := q.upstream()
	defer q.end()
	nextErr := next.ServeHTTP(out, req)
	return q.finish(q.classify(nextErr), nextErr)
}

// finish gives the key back after o and answers: next's answer, or the
// problem its mode gives in its place.
func (q *heldRequest) finish(o outcome, nextErr error) error {
	if o.lost {
		q.lockLost()
	}
	q.giveBack(o)
	if o.kind == aborted && q.hw.started {
		q.abort()
	}
	if ok, err := q.back.inPlace(q.hw, o); ok {
		if o.kind == aborted {
			q.count(resultLost)
		} else {
			q.countUnanswered(o.lost)
		}
		return q.close(err)
	}
	q.countOutcome(o.lost)
	return q.close(nextErr)
}

// giveBack gives the key back once, after o, with how long it was held.
func (q *heldRequest) giveBack(o outcome) {
	if q.given {
		return
	}
	q.given = true
	held := time.Since(q.acquired)
	metrics.hold.Observe(held.Seconds())
	q.h.holds.observe(held)
	q.back.give(o, q.unhold)
}

// errClientGoneTooLong ends a request whose client left a lease ago.
var errClientGoneTooLong = errors.New("redis_lock: the client left a lease ago and the backend has not answered")

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
	if q.record != nil && q.h.LostLock == LostLockAbort {
		// Either lock lost cancels next: the record's lets a duplicate
		// begin, the account's another request of the account run.
		q.stopRecord = context.AfterFunc(q.record.Context(), func() { q.cancel(context.Cause(q.record.Context())) })
	}
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
	if q.stopRecord != nil {
		q.stopRecord()
	}
	q.cancel(nil)
}

// gaveUp reports whether next was cancelled a lease after its client left.
func (q *heldRequest) gaveUp() bool {
	return errors.Is(context.Cause(q.ctx), errClientGoneTooLong)
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

// lost reports whether a lock was lost while next ran: lk, or the
// record's beside an account's.
func (q *heldRequest) lost() bool {
	lk, _ := q.lostLock()
	return lk != nil
}

// lostLock is the lock lost while next ran, and why its context ended; nil
// when none was.
func (q *heldRequest) lostLock() (*engine.Lock, error) {
	for _, lk := range []*engine.Lock{q.lk, q.record} {
		if lk == nil {
			continue
		}
		if cause := context.Cause(lk.Context()); errors.Is(cause, engine.ErrNotHeld) {
			return lk, cause
		}
	}
	return nil, nil
}

// lockLost logs and counts the lock lost while next ran.
func (q *heldRequest) lockLost() {
	lk, cause := q.lostLock()
	if lk == nil {
		return
	}
	rk := ""
	if q.recordGB.pending != nil {
		rk = record.Key(q.recordGB.pending.Key())
	}
	q.h.lockLost(lk, rk, cause)
}

// recoverPanic, deferred, gives the key back as after an answer that broke
// off, drops the held bytes so that the response stays incomplete, counts
// the request unless it was, and panics again. reverse_proxy panics with
// http.ErrAbortHandler when the upstream answer breaks off mid-body or its
// request is cancelled.
func (q *heldRequest) recoverPanic() {
	p := recover()
	if p == nil {
		return
	}
	lost := q.lost()
	q.giveBack(outcome{kind: brokeOff, lost: lost})
	q.hw.discard()
	switch {
	case q.counted:
	case lost:
		q.lockLost()
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
