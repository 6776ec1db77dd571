package redislock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"go.uber.org/zap"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
	"github.com/reqlock/caddy-redis-lock/internal/redisconn"
	"github.com/reqlock/caddy-redis-lock/record"
)

// complete stores resp as the outcome of p's request. When Redis does not
// answer, it tries again in the background until the lease has passed once
// more, so that a retry that comes once Redis has recovered finds the outcome
// (complete.lua still writes it while no other request has the key). A lost
// lock's answer is due at once: its outcome is stored in the background
// from the first attempt. An outcome stored on the primary but not
// acknowledged by the replicas (`replicas`) is answered, and written again
// in the background until they acknowledge it: a failover meanwhile
// promotes a replica that has the request's lock, with its token, and
// complete.lua stores the outcome there. A large answer's first try runs
// in the background too (completeBulk).
func (h *Handler) complete(ctx context.Context, p *record.Pending, resp *record.Response, lost bool, done func()) {
	if !lost && record.Bulk(resp) && h.completeBulk(ctx, p, resp, done) {
		return
	}
	since := time.Now()
	err := engine.ErrUnavailable
	if !lost {
		err = p.Complete(ctx, resp, time.Duration(h.Idempotency.Retention))
	} else {
		p.Stop()
	}
	h.unacked(p, err)
	if retried(err) {
		started := h.storeInBackground(ctx, resp, func(ctx context.Context) {
			defer done()
			h.afterFirstTry(ctx, p, resp, lost, err, since)
		})
		if started {
			return
		}
	}
	done()
	p.Stop()
	h.stored(p.Lock, resp, lost, err, nil)
}

// completeBulk stores a Bulk answer, whose try may take longer than the
// timeout to reach Redis over a slow link (its bound is its size's,
// record's tryTimeout), while the lease is renewed beside it: the try
// runs in the background from the start, and the client's answer waits
// for it at most the timeout (ReleaseTimeout), as for any answer; the
// tries go on after that. It reports false when no background work could
// start (MaxBackground): then the answer is stored as any other.
func (h *Handler) completeBulk(ctx context.Context, p *record.Pending, resp *record.Response, done func()) bool {
	tried := make(chan struct{})
	started := h.storeInBackground(ctx, resp, func(ctx context.Context) {
		defer done()
		since := time.Now()
		err := p.Complete(ctx, resp, time.Duration(h.Idempotency.Retention))
		close(tried)
		h.unacked(p, err)
		h.afterFirstTry(ctx, p, resp, false, err, since)
	})
	if !started {
		return false
	}
	if wait := h.locker.Config().ReleaseTimeout; wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-tried:
		case <-t.C:
		}
		return true
	}
	<-tried
	return true
}

// unacked warns of an answer stored but not acknowledged by the replicas:
// answered, and written again in the background.
func (h *Handler) unacked(p *record.Pending, err error) {
	if errors.Is(err, engine.ErrNotReplicated) {
		metrics.unacked.inc(writeAnswer)
		h.unackedWarn.warn(h.logger, "a stored response not acknowledged by the replicas in time: answered, and written again in the background",
			zap.String("record_key", record.Key(p.Key())), zap.Error(err))
	}
}

// afterFirstTry ends a completion whose first try, begun at since, ended
// with err: tried again while it may succeed (retryComplete), then finished.
func (h *Handler) afterFirstTry(ctx context.Context, p *record.Pending, resp *record.Response, lost bool, err error, since time.Time) {
	h.finish(ctx, p, resp, lost, h.retryComplete(ctx, p, resp, err, since))
}

// retried reports whether a completion whose try ended with err is tried
// again. An answer is tried again past a lock another request holds
// (ErrKeyHeld: nothing written) as well: after a Redis pause, the begin of
// a duplicate that got 503 can reach Redis first and take the key; once it
// is given back, the answer is stored, and a retry gets it rather than
// running again. A later run that is real stores its own answer first
// (complete.lua never overwrites one). With replicas, an answer that Redis
// did not take, or took without the replicas, may be only on a primary
// that is failing over: it is tried again through the failover, and past a
// lock the promoted replica holds for a request it refuses for want of
// replicas.
func retried(err error) bool { return again(err) || errors.Is(err, record.ErrKeyHeld) }

// retryComplete tries p's completion again, after a first try that ended
// with err, until a lease or completeRetryFor (more with replicas) has
// passed since the first began, and returns the last try's error. A Bulk
// answer whose try ran out its bound (its size's) while the lease was
// renewed beside it is not sent again: the link is too slow for it, and
// every try sends it whole; it is given up (finish).
func (h *Handler) retryComplete(ctx context.Context, p *record.Pending, resp *record.Response, err error, since time.Time) error {
	retryFor := h.retryFor()
	bulk := record.Bulk(resp)
	tryAgain := func(err error) bool {
		return retried(err) && !(bulk && timedOut(err) && p.Context().Err() == nil)
	}
	if !tryAgain(err) {
		return err
	}
	// The first try at once (a lost lock's answer has had none).
	h.retry(since.Add(retryFor), 0, func() bool {
		err = p.Complete(ctx, resp, time.Duration(h.Idempotency.Retention))
		return tryAgain(err)
	})
	return err
}

// retryFor is how long an answer that Redis did not take is tried again in
// the background: a lease, or completeRetryFor; with `replicas`,
// unackedRetryFor, through a failover.
func (h *Handler) retryFor() time.Duration {
	retryFor := max(time.Duration(h.TTL), completeRetryFor)
	if h.Redis != nil && h.Redis.Replicas > 0 {
		retryFor = max(retryFor, unackedRetryFor)
	}
	return retryFor
}

// retry calls try after pause, then again at once when Redis recovers or
// completeRetryPause has passed, while try reports that it must be tried
// again and deadline has not passed.
func (h *Handler) retry(deadline time.Time, pause time.Duration, try func() (again bool)) {
	recovered := h.conn.Recovery().Watch()
	for time.Now().Before(deadline) {
		recovered.Wait(pause)
		if !try() {
			return
		}
		pause = completeRetryPause
	}
}

// timedOut reports whether a try ended at its own bound.
func timedOut(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

// finish ends p's completion in the background, whose last try ended
// with err: the lock's keep-alive, which went on through the tries, stops.
// An answer that Redis did not take while the lock was still ours (renewed
// all along) is given up, and says so: an outcome-unknown record in its
// place (giveUp).
func (h *Handler) finish(ctx context.Context, p *record.Pending, resp *record.Response, lost bool, err error) {
	if errors.Is(err, engine.ErrUnavailable) && p.Context().Err() == nil && resp.Outcome != record.Unknown {
		h.giveUp(ctx, p, lost, err)
		return
	}
	p.Stop()
	h.stored(p.Lock, resp, lost, err, nil)
}

// giveUp stores the outcome-unknown record in place of an answer that
// could not be stored in its bound (err, its last try's) while p's lock was
// still held: a link too slow for its size, say. A retry then gets 502
// outcome-unknown, never a second run. It goes through the checked
// complete.lua as any answer does, so it is written only where Redis
// allows: while no other request holds the key; and it is tried again as
// any answer is.
func (h *Handler) giveUp(ctx context.Context, p *record.Pending, lost bool, err error) {
	unknown := h.unknownOutcome()
	since := time.Now()
	uerr := h.retryComplete(ctx, p, unknown, p.Complete(ctx, unknown, time.Duration(h.Idempotency.Retention)), since)
	p.Stop()
	if uerr != nil && !errors.Is(uerr, record.ErrNotStored) {
		uerr = fmt.Errorf("%w; then outcome-unknown in its place: %w", err, uerr)
	}
	h.stored(p.Lock, unknown, lost, uerr, err)
}

// again reports whether a completion that ended with err is tried again.
func again(err error) bool {
	return errors.Is(err, engine.ErrUnavailable) || errors.Is(err, engine.ErrNotReplicated)
}

// completeRetryFor is how long an outcome is tried again in the background
// while Redis does not answer (at least a lease): a retry that comes once
// Redis recovered finds it, unless it comes within a reconnect
// (redisconn.RedialInterval) and a round trip of Redis's recovery, when the
// tries are woken (redisconn.Recovery), or a try's own timeout when one was
// in flight.
const completeRetryFor = 10 * time.Second

// maxBackground bounds a route's background work (its lock client's
// MaxBackground): above all the answers Redis did not take, each tried
// again until it does, and a lost lock's release or a record given back.
// Past it an answer is not stored, and its retry runs again after the
// lease; so it is as large as the answers a route may give at once while
// Redis is away (lock.Config's default, 64, dropped the 65th). A give-back
// of an acquire has a queue of its own.
const maxBackground = 1024

// maxAnswersHeld bounds the bytes of the answers a route holds in the
// background (each until stored, for completeRetryFor at most; two minutes
// with replicas): 1024 answers of a few KiB, or 64 of max_response's
// default (1 MiB).
const maxAnswersHeld = 64 << 20

// storeInBackground runs f, the storing of resp, in the background, while the
// route's answers held there stay within maxAnswersHeld and its
// background work within maxBackground; it reports whether f runs.
func (h *Handler) storeInBackground(ctx context.Context, resp *record.Response, f func(context.Context)) bool {
	size := int64(resp.Size())
	if h.answersHeld.Add(size) > maxAnswersHeld {
		h.answersHeld.Add(-size)
		return false
	}
	started := h.locker.Background(ctx, func(ctx context.Context) {
		defer h.answersHeld.Add(-size)
		f(ctx)
	})
	if !started {
		h.answersHeld.Add(-size)
	}
	return started
}

// completeRetryPause is the pause between two tries of an outcome: as
// short as the pools' probe's (redisconn.RedialInterval), as a node whose
// pool did not go over to the probe is woken by nothing but its own tries.
// A try that fails fast (Redis refusing connections) costs a dial; one
// against a hung Redis waits its timeout; at most MaxBackground run at once.
const completeRetryPause = redisconn.RedialInterval

// unackedRetryFor is how long an answer stored but not acknowledged by
// the replicas (`replicas`) is written again (record.UnackedRetryFor).
const unackedRetryFor = record.UnackedRetryFor

// stored counts and logs the end of a completion of a request whose lock
// was lost or not. gaveUp, when not nil, is why resp, an outcome-unknown
// record, was stored in the place of the answer (giveUp).
func (h *Handler) stored(lk *engine.Lock, resp *record.Response, lost bool, err, gaveUp error) {
	if errors.Is(err, engine.ErrNotReplicated) {
		// Stored and released on the primary: a failover can lose it.
		h.unackedWarn.warn(h.logger, "a stored response never acknowledged by the replicas: a failover can lose it", zap.String("record_key", record.Key(lk.Key())), zap.Error(err))
		err = nil
	}
	observeRelease(err)
	if err != nil {
		if !errors.Is(err, record.ErrNotStored) || errors.Is(err, record.ErrKeyHeld) {
			metrics.givenUp.inc(givenUpNone) // not another's answer: nothing stored
		}
		h.storeWarn.warn(h.logger, "storing a response", zap.String("record_key", record.Key(lk.Key())), zap.Error(err))
		return
	}
	metrics.stored.Observe(float64(resp.Size()))
	if resp.Outcome == record.Unknown {
		metrics.unknown.Inc()
		result := resultAcquired
		if lost {
			result = resultLost
		}
		h.events.emit(eventOutcomeUnknown, lk.Key(), record.Key(lk.Key()), lk.Fence(), result)
		msg := "outcome unknown: a problem response is stored in its place; DELETE it through the admin API (/redis_lock/keys) to let a retry run"
		fields := []zap.Field{zap.String("record_key", record.Key(lk.Key())), zap.Int64("fencing_token", lk.Fence())}
		if gaveUp != nil {
			metrics.givenUp.inc(givenUpUnknown)
			msg = "answer given up: Redis did not take it in time while the lock was held; outcome-unknown is stored in its place (retries get 502); DELETE it through the admin API (/redis_lock/keys) to let a retry run"
			fields = append(fields, zap.NamedError("answer_error", gaveUp))
		}
		h.logger.Warn(msg, fields...)
	}
}

// unknownOutcome is the record of a request whose answer never came.
func (h *Handler) unknownOutcome() *record.Response {
	p := problemOutcomeUnknown
	return &record.Response{Outcome: record.Unknown, Status: p.status, Header: p.headers(), Body: p.json}
}
