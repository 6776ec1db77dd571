package redislock

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"

	"go.uber.org/zap"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
	"github.com/reqlock/caddy-redis-lock/record"
)

// giveBack is how a mode gives its key back once its request's outcome is
// known: the lock released (lockGiveBack), or the outcome stored with it
// (recordGiveBack).
type giveBack interface {
	// writer is what next writes its answer to.
	writer(hw *holdWriter) http.ResponseWriter
	// give gives the key back after o, and calls done once its work, in
	// the background or not, is over.
	give(o outcome, done func())
	// inPlace writes the problem the client gets in the place of next's
	// answer after o, if there is one, and reports whether it did.
	inPlace(w http.ResponseWriter, o outcome) (bool, error)
}

// lockGiveBack releases a lock-only request's lock.
type lockGiveBack struct {
	h  *Handler
	r  *http.Request
	lk *engine.Lock
}

func (g *lockGiveBack) writer(hw *holdWriter) http.ResponseWriter { return hw }

// give releases the lock before the response completes, waiting on Redis
// for at most the client's timeout. This lock, lost, is released in the
// background: its answer is due now, at the local deadline. Still held, it
// is left to its lease when the request is unanswered, or was cancelled
// because another lock of it was lost (a record's, per account): the
// connection broke, not necessarily the backend's work, which may still be
// charging, and a duplicate must not run beside it.
func (g *lockGiveBack) give(o outcome, done func()) {
	switch {
	case o.lost && errors.Is(context.Cause(g.lk.Context()), engine.ErrNotHeld):
		g.lk.ReleaseAsync(g.r.Context(), func(err error) {
			observeRelease(err)
			done()
		})
	case o.kind == unanswered || o.kind == aborted:
		g.lk.Stop()
		done()
	default:
		err := g.lk.Release(g.r.Context())
		observeRelease(err)
		done()
		if err != nil && !errors.Is(err, engine.ErrNotHeld) {
			g.h.releaseWarn.warn(g.h.logger, "releasing lock", zap.String("key", g.lk.Key()), zap.Error(err))
		}
	}
}

// inPlace answers a request that may have run unanswered with
// outcome-unknown: whatever status reverse_proxy gives it (a reset, a
// timeout, a stopped second sending, a lost lock's cancel), a retry must
// not charge again unseen, and the lost lock no longer keeps it out. A lost
// lock (lost_lock abort) whose request never reached a backend is
// lock-lost: nothing ran, a retry may.
func (g *lockGiveBack) inPlace(w http.ResponseWriter, o outcome) (bool, error) {
	switch {
	case o.kind == aborted && o.unsent:
		return true, g.h.writeProblem(w, problemLockLost)
	case o.kind == aborted, o.kind == unanswered && !o.lost:
		return true, g.h.writeProblem(w, problemOutcomeUnknown)
	}
	return false, nil
}

// accountGiveBack stores a per-account request's outcome in its record
// (`idempotency { key }`), then releases the account's lock as a lock-only
// request's: left to its lease when the request may still be running
// unanswered, so that no other request of the account runs beside it. A
// request cancelled because its record's lock was lost may be running too:
// the account's lock, still held, is left to its lease as well. done is
// called once both are over.
type accountGiveBack struct {
	record *recordGiveBack
	lock   *lockGiveBack
	left   atomic.Int32
}

func (g *accountGiveBack) writer(hw *holdWriter) http.ResponseWriter { return g.record.writer(hw) }

func (g *accountGiveBack) give(o outcome, done func()) {
	g.left.Store(2)
	both := func() {
		if g.left.Add(-1) == 0 {
			done()
		}
	}
	g.record.give(o, both)
	g.lock.give(o, both)
}

func (g *accountGiveBack) inPlace(w http.ResponseWriter, o outcome) (bool, error) {
	return g.record.inPlace(w, o)
}

// recordGiveBack stores an idempotent request's outcome with its lock.
type recordGiveBack struct {
	h       *Handler
	r       *http.Request
	pending *record.Pending
	rec     *recordingWriter
}

func (g *recordGiveBack) writer(hw *holdWriter) http.ResponseWriter {
	c := g.h.Idempotency
	g.rec = newRecordingWriter(hw, c.MaxResponse, g.r.Method == http.MethodHead, c.ReplayCookies)
	return g.rec
}

// give stores the answer, or outcome-unknown for a request sent and not
// answered (a lost lock, an answer that broke off, no answer), and
// releases the lock, waiting on Redis for at most the client's timeout. A
// request that never reached a backend, or whose answer the store policy
// does not keep, gives its record up: a retry runs.
func (g *recordGiveBack) give(o outcome, done func()) {
	var resp *record.Response
	switch o.kind {
	case aborted, brokeOff, unanswered:
		resp = g.h.unknownOutcome()
	case answered:
		if g.h.Idempotency.policy.stores(g.rec.status) {
			resp = g.rec.response()
		}
	}
	if resp != nil {
		g.h.complete(g.r.Context(), g.pending, resp, o.lost, done)
		return
	}
	err := g.h.giveRecordBack(g.r.Context(), g.pending)
	observeRelease(err)
	done()
	if err != nil && !errors.Is(err, engine.ErrNotHeld) {
		g.h.releaseWarn.warn(g.h.logger, "giving up a record", zap.String("key", g.pending.Key()), zap.Error(err))
	}
}

// inPlace answers a request sent and not answered with outcome-unknown,
// as its retries will be answered from the record, whatever the errors
// setting.
func (g *recordGiveBack) inPlace(w http.ResponseWriter, o outcome) (bool, error) {
	if o.kind == aborted || o.kind == unanswered {
		return true, writeProblemBody(w, problemOutcomeUnknown)
	}
	return false, nil
}
