package redislock

import (
	"context"
	"errors"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
	"github.com/reqlock/caddy-redis-lock/record"
)

// Placeholders the handler sets.
const (
	phKey       = "http.redis_lock.key"
	phFence     = "http.redis_lock.fencing_token"
	phResult    = "http.redis_lock.result"
	phRecordKey = "http.redis_lock.record_key"
)

// ServeHTTP takes the lock for the request's key, calls next while holding
// it, and releases it before the response completes.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	repl, _ := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if repl == nil {
		repl = caddy.NewReplacer()
	}
	if !h.FencingHeaderOff {
		stripFencing(r, h.FencingHeader) // only this handler may set it
	}
	// Early data can be replayed by an attacker: never take a lock on it.
	if r.TLS != nil && !r.TLS.HandshakeComplete {
		return h.reject(w, repl, resultTooEarly, problemTooEarly)
	}
	if h.inputs.repeated(r) {
		return h.reject(w, repl, resultRejected, problemAmbiguousKey)
	}
	var body []byte
	if h.readsBody {
		var err error
		if body, err = readBody(r, h.MaxBody); err != nil {
			return h.rejectBody(w, r, repl, err)
		}
	}
	// A request without a body (the GET of a checkout page on the path
	// its form posts to) has no fields: its key is missing, not invalid.
	if len(h.inputs.jsonPaths) > 0 && len(body) > 0 {
		doc, err := parseJSON(body)
		if err != nil {
			return h.rejectBody(w, r, repl, err)
		}
		fields, err := jsonFields(doc, h.inputs.jsonPaths)
		if err != nil {
			return h.reject(w, repl, resultRejected, problemAmbiguousKey)
		}
		repl.Map(fields)
	}
	if len(h.inputs.formNames) > 0 && len(body) > 0 {
		vals, err := parseForm(r, body)
		if err != nil {
			return h.reject(w, repl, resultRejected, problemInvalidForm)
		}
		fields, err := formFields(vals, h.inputs.formNames)
		if err != nil {
			return h.reject(w, repl, resultRejected, problemAmbiguousKey)
		}
		repl.Map(fields)
	}
	scope, scopeMissing, err := h.scopeTmpl.expand(repl, nil)
	if err != nil {
		return caddyhttp.Error(http.StatusInternalServerError, err)
	}
	var keyValue func(key string, val any) (any, error)
	if h.Idempotency != nil {
		keyValue = idempotencyKeyPlaceholder
	}
	key, keyMissing, err := h.keyTmpl.expand(repl, keyValue)
	if errors.Is(err, errInvalidIdempotencyKey) {
		return h.reject(w, repl, resultRejected, problemInvalidIdempotencyKey)
	} else if err != nil {
		return caddyhttp.Error(http.StatusInternalServerError, err)
	}
	if keyMissing || scopeMissing {
		if h.MissingKey == MissingKeyPass {
			h.count(repl, resultBypassed)
			return next.ServeHTTP(w, r)
		}
		return h.reject(w, repl, resultRejected, problemMissingKey)
	}

	rkey := engine.Key(h.Prefix, scope, key)
	repl.Set(phKey, rkey)
	if h.Idempotency != nil {
		canonical, err := h.Idempotency.canonicalJSON(body)
		if err != nil {
			return h.rejectBody(w, r, repl, err)
		}
		return h.serveIdempotent(w, r, next, repl, rkey, h.Idempotency.fingerprint(r, body, canonical))
	}
	start := time.Now()
	h.client.hold()
	ctx, keep := untilAcquired(r.Context(), h.Wait > 0)
	lk, err := h.locker.Acquire(ctx, rkey, h.lockOptions())
	if err == nil && !keep() {
		// The client left as the lock was taken: nothing ran.
		lk.ReleaseAsync(ctx, func(err error) { observeRelease(err); h.client.done() })
		h.count(repl, resultCancelled)
		return nil
	}
	if err == nil {
		metrics.wait.Observe(time.Since(start).Seconds())
		return h.serveLocked(w, r, next, repl, lk)
	}
	keep()
	h.client.done()
	var notObtained *engine.NotObtainedError
	switch {
	case errors.As(err, &notObtained):
		metrics.wait.Observe(time.Since(start).Seconds())
		return h.reject(w, repl, resultConflict, problemConflict.withRetryAfter(h.holds.retryAfter(notObtained.Remaining)))
	case r.Context().Err() != nil:
		h.count(repl, resultCancelled) // the client is gone: nobody to answer
		return nil
	default:
		return h.unavailableRedis(w, r, next, repl, rkey, err)
	}
}

// untilAcquired is the context an acquire runs on: the wait for a held lock
// ends when the client leaves, but the lock it takes does not, as the
// request it runs outlives its client (heldRequest.upstream). keep reports
// whether the client was still there when the acquire ended; if not, the
// context has ended or may yet end. Without a wait the acquire is one
// round trip and the client is only checked after it, which saves the
// watch's allocations on every request.
func untilAcquired(client context.Context, wait bool) (ctx context.Context, keep func() bool) {
	if !wait {
		return context.WithoutCancel(client), func() bool { return client.Err() == nil }
	}
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(client))
	stop := context.AfterFunc(client, func() { cancel(context.Cause(client)) })
	return ctx, func() bool { return stop() && client.Err() == nil }
}

// unavailableRedis answers a request whose lock could not be taken because
// Redis failed: 503, or the request passed on unlocked with fail_open.
func (h *Handler) unavailableRedis(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, repl *caddy.Replacer, rkey string, err error) error {
	if errors.Is(err, engine.ErrNotReplicated) {
		metrics.unacked.inc(writeLock)
	}
	result := resultUnavailable
	if h.OnError == OnErrorFailOpen {
		result = resultFailOpen
	}
	h.events.emit(eventRedisUnavailable, rkey, h.recordKey(rkey), 0, result)
	if h.OnError == OnErrorFailOpen {
		h.unavailable.warn(h.logger, "redis unavailable: passing the request on unlocked (fail_open)",
			zap.String("key", rkey), zap.Error(err))
		h.count(repl, resultFailOpen)
		return next.ServeHTTP(w, r)
	}
	h.unavailable.warn(h.logger, "redis unavailable: answering 503 (fail_closed)",
		zap.String("key", rkey), zap.Error(err))
	return h.reject(w, repl, resultUnavailable, problemUnavailable)
}

// serveLocked calls next while lk is held and releases lk before the last
// byte of the response is written, whatever next does (returns, fails,
// panics). next runs detached from the client (heldRequest.upstream).
func (h *Handler) serveLocked(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, repl *caddy.Replacer, lk *engine.Lock) error {
	q := h.hold(w, r, repl, lk)
	// release deletes the lock before the response completes, waiting on
	// Redis for at most the client's timeout. A lost lock is released in
	// the background: its answer is due now, at the local deadline.
	release := func(lost bool) {
		q.giveBack(func(done func()) {
			if lost {
				lk.ReleaseAsync(r.Context(), func(err error) {
					observeRelease(err)
					done()
				})
				return
			}
			err := lk.Release(r.Context())
			observeRelease(err)
			done()
			if err != nil && !errors.Is(err, engine.ErrNotHeld) {
				h.releaseWarn.warn(h.logger, "releasing lock", zap.String("key", lk.Key()), zap.Error(err))
			}
		})
	}
	defer q.recoverPanic(release)

	req := q.upstream()
	defer q.end()
	nextErr := next.ServeHTTP(q.hw, req)

	lost, cause := q.lost()
	unknown := !lost && !q.hw.started && q.unanswered(nextErr)
	if unknown {
		// The connection broke, not necessarily the backend's work: it may
		// still be charging. The lock is left to its lease rather than
		// released, so that a duplicate does not run beside it.
		q.giveBack(func(done func()) { lk.Stop(); done() })
	} else {
		release(lost)
	}
	if lost {
		h.lockLost(lk, cause)
	}
	switch {
	case lost && h.LostLock == LostLockAbort && q.hw.started:
		q.abort()
	case lost && h.LostLock == LostLockAbort:
		// next's error is the cancellation this handler caused.
		q.count(resultLost)
		return q.close(h.writeProblem(q.hw, problemLockLost))
	case unknown:
		// Whatever status reverse_proxy gives it (a reset, a timeout, a
		// stopped second sending), the request may have run: a retry
		// must not charge again unseen.
		q.countUnanswered(lost)
		return q.close(h.writeProblem(q.hw, problemOutcomeUnknown))
	}
	q.countOutcome(lost)
	return q.close(nextErr)
}

// runUnder marks r as running under lk: its result acquired, its fencing
// token in the placeholder and, unless turned off, the request header.
func (h *Handler) runUnder(r *http.Request, repl *caddy.Replacer, lk *engine.Lock) {
	repl.Set(phFence, lk.Fence())
	repl.Set(phResult, resultAcquired)
	if !h.FencingHeaderOff {
		r.Header.Set(h.FencingHeader, strconv.FormatInt(lk.Fence(), 10))
	}
}

// lockLost logs and counts a lock lost while its request was in flight.
func (h *Handler) lockLost(lk *engine.Lock, cause error) {
	metrics.lost.Inc()
	h.events.emit(eventLockLost, lk.Key(), h.recordKey(lk.Key()), lk.Fence(), resultLost)
	h.logger.Warn("lock lost while the request was in flight",
		zap.String("key", lk.Key()), zap.Int64("fencing_token", lk.Fence()),
		zap.String("lost_lock", h.LostLock), zap.NamedError("cause", cause))
}

// recordKey is the idempotency record's key of the lock key rkey; "" when
// the handler keeps no records.
func (h *Handler) recordKey(rkey string) string {
	if h.Idempotency == nil {
		return ""
	}
	return record.Key(rkey)
}

// rejectBody answers a request whose body could not be read for the key:
// never with the 200 of an empty response.
func (h *Handler) rejectBody(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, err error) error {
	switch {
	case errors.Is(err, errBodyTooLarge):
		return h.reject(w, repl, resultRejected, problemBodyTooLarge)
	case errors.Is(err, errInvalidJSON):
		return h.reject(w, repl, resultRejected, problemInvalidJSON)
	case errors.Is(err, os.ErrDeadlineExceeded):
		// The server's read timeout: the client may still be there.
		return h.reject(w, repl, resultRejected, problemBodyTimeout)
	case r.Context().Err() != nil:
		// The client went away: nobody to answer. 499 is what
		// reverse_proxy logs in this case too.
		h.count(repl, resultCancelled)
		return caddyhttp.Error(499, err)
	default:
		return h.reject(w, repl, resultRejected, problemBodyUnreadable)
	}
}

// reject answers with p and records result.
func (h *Handler) reject(w http.ResponseWriter, repl *caddy.Replacer, result string, p problem) error {
	h.count(repl, result)
	return h.writeProblem(w, p)
}

// count sets {http.redis_lock.result} and counts the request.
func (h *Handler) count(repl *caddy.Replacer, result string) {
	repl.Set(phResult, result)
	metrics.requests.inc(result)
}

// lockOptions are the lock's options from the config.
func (h *Handler) lockOptions() engine.Options {
	renew := time.Duration(h.Renew)
	if h.RenewOff {
		renew = engine.NoRenew
	}
	return engine.Options{TTL: time.Duration(h.TTL), Renew: renew, Wait: time.Duration(h.Wait)}
}
