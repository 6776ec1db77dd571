package redislock

import (
	"errors"
	"net/http"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

// outcome is what became of a request that ran under its key: one
// classification, which each mode's give-back maps to its actions.
type outcome struct {
	kind   outcomeKind
	lost   bool // the lock was lost while next ran
	unsent bool // aborted: the request is known never to have reached a backend
}

type outcomeKind int

const (
	// answered: next returned without an error; its answer, whatever its
	// status, is the request's.
	answered outcomeKind = iota
	// aborted: the lock was lost and next cancelled (lost_lock abort).
	aborted
	// brokeOff: the answer began, then broke off (or next panicked).
	brokeOff
	// unanswered: sent, maybe done, never answered (unanswered).
	unanswered
	// notReached: next failed before any backend could act on it.
	notReached
)

// classify is the outcome of q's request, whose next returned nextErr.
func (q *heldRequest) classify(nextErr error) outcome {
	lost := q.lost()
	o := outcome{lost: lost}
	switch {
	case lost && q.h.LostLock == LostLockAbort:
		o.kind, o.unsent = aborted, q.once.unsent()
	case nextErr != nil && q.hw.started:
		o.kind = brokeOff
	case q.unanswered(nextErr):
		o.kind = unanswered
	case nextErr != nil:
		o.kind = notReached
	}
	return o
}

// unanswered reports whether next's error leaves the request's outcome
// unknown: it may have reached a backend, which never answered (a reset or
// a timeout after the request was written, a second sending stopped, a
// backend cut off a lease after its client left). Only a request no
// backend could act on (neverReached) is known not to have run.
func (q *heldRequest) unanswered(nextErr error) bool {
	return nextErr != nil && (q.once.stopped() || q.gaveUp() || !neverReached(nextErr))
}

// neverReached reports whether next failed before any backend could act on
// the request: a refused connection, no upstream available, or a status
// that says "not processed". Any other error after the request may have
// gone out leaves the outcome unknown.
func neverReached(err error) bool {
	var dialErr reverseproxy.DialError
	if errors.As(err, &dialErr) {
		return true
	}
	var he caddyhttp.HandlerError
	if errors.As(err, &he) {
		return notProcessed(he.StatusCode) || (he.StatusCode >= 400 && he.StatusCode < 500)
	}
	return false
}

// notProcessed are the statuses that say "not processed, try again": their
// record is removed so that a retry runs.
func notProcessed(status int) bool {
	switch status {
	case http.StatusRequestTimeout, http.StatusTooEarly, http.StatusTooManyRequests, http.StatusServiceUnavailable:
		return true
	}
	return false
}
