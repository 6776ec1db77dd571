package redislock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
	"github.com/reqlock/caddy-redis-lock/record"
)

// errClientGoneTooLong ends a request whose client left a lease ago.
var errClientGoneTooLong = errors.New("redis_lock: the client left a lease ago and the backend has not answered")

// notProcessed are the statuses that say "not processed, try again": their
// record is removed so that a retry runs.
func notProcessed(status int) bool {
	switch status {
	case http.StatusRequestTimeout, http.StatusTooEarly, http.StatusTooManyRequests, http.StatusServiceUnavailable:
		return true
	}
	return false
}

// serveIdempotent begins the request under its record: it replays a
// completed one, refuses another request under the same key, and runs a new
// one with its record in progress.
func (h *Handler) serveIdempotent(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, repl *caddy.Replacer, rkey, fingerprint string) error {
	repl.Set(phRecordKey, record.Key(rkey))
	// The record outlives the client: a request that begins runs on, and
	// its answer is stored, when the client goes away (bounded by the
	// lease and its renewal), so that the client's retry gets it.
	ctx := context.WithoutCancel(r.Context())
	start := time.Now()
	h.client.hold()
	// Just after Redis's return, the answers other requests got while it
	// was away are stored first.
	backAt := h.client.back.lastBack()
	if settle(backAt) {
		metrics.settled.inc(settleWaited)
	}
	pending, err := h.store.Begin(ctx, rkey, fingerprint, h.lockOptions())
	if err == nil && h.client.back.lastBack() != backAt {
		pending, err = h.beginAgain(ctx, pending, rkey, fingerprint, start)
	}
	if err == nil {
		metrics.wait.Observe(time.Since(start).Seconds())
		return h.serveRecorded(w, r, next, repl, pending)
	}
	h.client.done()
	var done *record.CompletedError
	var notObtained *engine.NotObtainedError
	switch {
	case errors.As(err, &done):
		metrics.wait.Observe(time.Since(start).Seconds())
		return h.replay(w, r, repl, done.Response)
	case errors.Is(err, record.ErrMismatch):
		return h.reject(w, repl, resultMismatch, problemMismatch)
	case errors.As(err, &notObtained):
		metrics.wait.Observe(time.Since(start).Seconds())
		return h.reject(w, repl, resultConflict, problemInProgress.withRetryAfter(h.holds.retryAfter(notObtained.Remaining)))
	case errors.Is(err, errNotGivenBack):
		// Not fail_open: the key is still held, for a request that
		// may run nowhere else meanwhile.
		h.unavailable.warn(h.logger, "redis unavailable: answering 503", zap.String("key", rkey), zap.Error(err))
		return h.reject(w, repl, resultUnavailable, problemUnavailable)
	default:
		return h.unavailableRedis(w, r, next, repl, rkey, err)
	}
}

// beginAgain gives up pending, a request begun as Redis came back, and
// begins it again once the answers given while Redis was away are stored
// (settle). Its key may be free only because the lease of a holder that
// could not store its answer ran out during the outage; that holder's
// completion, woken by Redis's return too, is refused while another
// request holds the key, and lands once this one lets go. Without this, a
// retry that reached Redis a few milliseconds before that completion ran
// the request again.
//
// A key that could not be given back is answered 503 (errNotGivenBack):
// it stays held for its lease. The second begin waits only for what is
// left of the `wait`.
func (h *Handler) beginAgain(ctx context.Context, pending *record.Pending, rkey, fingerprint string, start time.Time) (*record.Pending, error) {
	at := h.client.back.lastBack()
	if err := pending.Release(ctx); err != nil && !errors.Is(err, engine.ErrNotHeld) {
		return nil, fmt.Errorf("%w: %w", errNotGivenBack, err)
	}
	metrics.settled.inc(settleBegunAgain)
	settle(at)
	opt := h.lockOptions()
	opt.Wait = max(opt.Wait-time.Since(start), 0)
	return h.store.Begin(ctx, rkey, fingerprint, opt)
}

// errNotGivenBack is a key begun as Redis came back that could not be
// given back for the second begin.
var errNotGivenBack = errors.New("redis_lock: a key begun as Redis came back could not be given back")

// serveRecorded runs a new request with its record in progress, and stores
// its outcome (or gives the record up) before the response completes.
func (h *Handler) serveRecorded(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, repl *caddy.Replacer, pending *record.Pending) error {
	lk := pending.Lock
	q := h.hold(w, r, repl, lk)
	rec := newRecordingWriter(q.hw, h.Idempotency.MaxResponse, r.Method == http.MethodHead, h.Idempotency.ReplayCookies)
	// store stores resp (nil: gives the record up) and releases the lock,
	// waiting on Redis for at most the client's timeout.
	store := func(resp *record.Response, lost bool) {
		q.giveBack(func(done func()) {
			if resp == nil {
				err := pending.Release(r.Context())
				observeRelease(err)
				done()
				if err != nil && !errors.Is(err, engine.ErrNotHeld) {
					h.releaseWarn.warn(h.logger, "giving up a record", zap.String("key", lk.Key()), zap.Error(err))
				}
				return
			}
			h.complete(r.Context(), pending, resp, lost, done)
		})
	}
	// A panic is an answer that broke off or never came: sent, not
	// answered.
	defer q.recoverPanic(func(lost bool) { store(h.unknownOutcome(), lost) })

	restrictAcceptEncoding(r)
	req := q.upstream()
	defer q.end()
	nextErr := next.ServeHTTP(rec, req)

	lost, cause := q.lost()
	if lost {
		h.lockLost(lk, cause)
	}
	switch {
	case lost && h.LostLock == LostLockAbort:
		// The upstream request was cancelled: sent, maybe done, not
		// answered. The answer is due now: the outcome is stored in the
		// background.
		store(h.unknownOutcome(), true)
		if q.hw.started {
			q.abort()
		}
		q.count(resultLost)
		return q.close(h.writeStoredProblem(q.hw, problemOutcomeUnknown))
	case nextErr != nil && q.hw.started:
		// The answer broke off after it began: what was recorded is not
		// the whole answer.
		store(h.unknownOutcome(), lost)
	case q.unanswered(nextErr):
		// Sent, maybe done, not answered.
		store(h.unknownOutcome(), lost)
		q.countUnanswered(lost)
		return q.close(h.writeStoredProblem(q.hw, problemOutcomeUnknown))
	case nextErr != nil:
		// Never reached a backend: nothing to keep, a retry runs.
		store(nil, lost)
	case !h.Idempotency.policy.stores(rec.status):
		store(nil, lost)
	default:
		store(rec.response(), lost)
	}
	q.countOutcome(lost)
	return q.close(nextErr)
}

// complete stores resp as the outcome of p's request. When Redis does not
// answer, it tries again in the background until the lease has passed once
// more, so that a retry that comes once Redis is back finds the outcome
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
		started := h.locker.Background(ctx, func(ctx context.Context) {
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
	started := h.locker.Background(ctx, func(ctx context.Context) {
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
	retryFor := max(time.Duration(h.TTL), completeRetryFor)
	if h.Redis != nil && h.Redis.Replicas > 0 {
		retryFor = max(retryFor, unackedRetryFor)
	}
	deadline := since.Add(retryFor)
	back := h.client.back.next()
	bulk := record.Bulk(resp)
	for pause := time.Duration(0); time.Now().Before(deadline) && retried(err); pause = completeRetryPause {
		if bulk && timedOut(err) && p.Context().Err() == nil {
			break
		}
		// The first try at once (a lost lock's answer has had none);
		// then at once when Redis is back.
		waitOrBack(back, pause)
		back = h.client.back.next()
		err = p.Complete(ctx, resp, time.Duration(h.Idempotency.Retention))
	}
	return err
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
// Redis is back finds it, unless it comes within a reconnect
// (redialInterval) and a round trip of Redis's return, when the tries are
// woken (redisBack), or a try's own timeout when one was in flight.
const completeRetryFor = 10 * time.Second

// completeRetryPause is the pause between two tries of an outcome: as
// short as the pools' probe's (redialInterval), as a node whose pool did
// not go over to the probe is woken by nothing but its own tries. A try
// that fails fast (Redis refusing connections) costs a dial; one against a
// hung Redis waits its timeout; at most MaxBackground run at once.
const completeRetryPause = redialInterval

// unackedRetryFor is how long an answer stored but not acknowledged by
// the replicas (`replicas`) is written again: through a failover, whose
// detection alone takes Sentinel's down-after-milliseconds (30s by
// default) or a Cluster's cluster-node-timeout (15s).
const unackedRetryFor = 2 * time.Minute

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

// unknownOutcome is the record of a request whose answer never came.
func (h *Handler) unknownOutcome() *record.Response {
	p := problemOutcomeUnknown
	return &record.Response{Outcome: record.Unknown, Status: p.status, Header: p.headers(), Body: p.json}
}

// writeStoredProblem answers the request itself with p, as its retries will
// be answered from the record, whatever the errors setting.
func (h *Handler) writeStoredProblem(w http.ResponseWriter, p problem) error {
	return writeProblemBody(w, p)
}
