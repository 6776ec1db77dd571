package redislock

import (
	"context"
	"errors"
	"fmt"
	"net/http"
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

// ServeHTTP derives the request's key, takes it (the lock, or the record
// begun with idempotency), runs next under it, and gives it back before the
// response completes. A key it cannot take is answered here: a replay, a
// conflict, a refusal, or Redis's failure.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	repl, _ := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if repl == nil {
		repl = caddy.NewReplacer()
	}
	k, err := h.keyOf(r, repl)
	if err != nil {
		return h.refuse(w, r, repl, err)
	}
	if k.missing {
		if h.MissingKey == MissingKeyPass {
			h.count(repl, resultBypassed)
			return next.ServeHTTP(w, r)
		}
		return h.reject(w, repl, resultRejected, problemMissingKey)
	}

	start := time.Now()
	unhold := h.conn.Hold()
	var lk *engine.Lock
	var pending *record.Pending
	switch {
	case k.record == "":
		lk, err = h.acquire(r, k.lock, unhold)
	case k.record == k.lock:
		if pending, err = h.begin(r, repl, k, start); err == nil {
			lk = pending.Lock
		}
	default:
		if pending, err = h.begin(r, repl, k, start); err == nil {
			lk, err = h.acquireAccount(r, k.lock, pending, start)
		}
	}
	if err != nil {
		if !errors.Is(err, errClientLeft) {
			unhold() // a lock taken as the client left lets go itself
		}
		return h.notTaken(w, r, next, repl, k, err, start)
	}
	if pending != nil {
		restrictAcceptEncoding(r)
	}
	metrics.wait.Observe(time.Since(start).Seconds())
	return h.hold(w, r, repl, lk, pending, unhold).run(next)
}

// acquire takes the lock of a lock-only request. The client's leaving ends
// a wait; a lock taken just as the client left is given back at once in
// the background (nothing ran under it), which lets go of the client's
// hold (unhold), and either is errClientLeft.
func (h *Handler) acquire(r *http.Request, rkey string, unhold func()) (*engine.Lock, error) {
	ctx, keep := untilAcquired(r.Context(), h.Wait > 0)
	lk, err := h.locker.Acquire(ctx, rkey, h.lockOptions())
	stayed := keep()
	var busy *engine.NotObtainedError
	switch {
	case err == nil && !stayed:
		lk.ReleaseAsync(ctx, func(err error) { observeRelease(err); unhold() })
		return nil, errClientLeft
	case err != nil && !errors.As(err, &busy) && r.Context().Err() != nil:
		return nil, fmt.Errorf("%w: %w", errClientLeft, err)
	}
	return lk, err
}

// acquireAccount takes the lock of a per-account request (`idempotency {
// key }`), whose record was begun: its own key's wait is taken out of the
// `wait`. The lock outlives the client as the record does. An account held
// by another request is errAccountBusy, and a record whose account lock was
// not taken is given up: nothing ran under it, and its retry runs.
func (h *Handler) acquireAccount(r *http.Request, accountKey string, pending *record.Pending, start time.Time) (*engine.Lock, error) {
	opt := h.lockOptions()
	opt.Wait = max(opt.Wait-time.Since(start), 0)
	ctx := context.WithoutCancel(r.Context())
	lk, err := h.locker.Acquire(ctx, accountKey, opt)
	if err == nil {
		return lk, nil
	}
	if gerr := h.giveRecordBack(ctx, pending); gerr != nil && !errors.Is(gerr, engine.ErrNotHeld) {
		h.releaseWarn.warn(h.logger, "giving up a record whose account lock was not taken",
			zap.String("key", pending.Key()), zap.Error(gerr))
	}
	var busy *engine.NotObtainedError
	if errors.As(err, &busy) {
		return nil, fmt.Errorf("%w: %w", errAccountBusy, err)
	}
	return nil, err
}

// errAccountBusy is a per-account request whose account another request
// holds: 409 conflict, where a duplicate of one in progress is in-progress.
var errAccountBusy = errors.New("redis_lock: another request of the account is in progress")

// errClientLeft is a lock not taken, or given back at once, because the
// client left: nobody to answer.
var errClientLeft = errors.New("redis_lock: the client left before the lock was taken")

// notTaken answers a request whose key was not taken: the stored answer
// replayed, another request under the key (409, with Retry-After), another
// request's key (422), a record its holder left unfinished (502), or
// Redis's failure.
func (h *Handler) notTaken(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, repl *caddy.Replacer, k requestKey, err error, start time.Time) error {
	var done *record.CompletedError
	var busy *engine.NotObtainedError
	switch {
	case errors.Is(err, errClientLeft):
		h.count(repl, resultCancelled)
		return nil
	case errors.As(err, &done):
		metrics.wait.Observe(time.Since(start).Seconds())
		return h.replay(w, r, repl, done.Response)
	case errors.Is(err, record.ErrMismatch):
		return h.reject(w, repl, resultMismatch, problemMismatch)
	case errors.Is(err, record.ErrAbandoned):
		metrics.wait.Observe(time.Since(start).Seconds())
		return h.abandoned(w, repl, k)
	case errors.As(err, &busy):
		metrics.wait.Observe(time.Since(start).Seconds())
		p := problemInProgress
		if k.record == "" || errors.Is(err, errAccountBusy) {
			p = problemConflict
		}
		return h.reject(w, repl, resultConflict, p.withRetryAfter(h.holds.retryAfter(busy.Remaining)))
	case errors.Is(err, errNotGivenBack):
		// Not fail_open: the key is still held, for a request that
		// may run nowhere else meanwhile.
		h.unavailable.warn(h.logger, "redis unavailable: answering 503", zap.String("key", k.lock), zap.Error(err))
		return h.reject(w, repl, resultUnavailable, problemUnavailable)
	default:
		return h.unavailableRedis(w, r, next, repl, k, err)
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
func (h *Handler) unavailableRedis(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, repl *caddy.Replacer, k requestKey, err error) error {
	if errors.Is(err, engine.ErrNotReplicated) {
		metrics.unacked.inc(writeLock)
	}
	result := resultUnavailable
	if h.OnError == OnErrorFailOpen {
		result = resultFailOpen
	}
	h.events.emit(eventRedisUnavailable, k.lock, k.recordKey(), 0, result)
	if h.OnError == OnErrorFailOpen {
		h.unavailable.warn(h.logger, "redis unavailable: passing the request on unlocked (fail_open)",
			zap.String("key", k.lock), zap.Error(err))
		h.count(repl, resultFailOpen)
		return next.ServeHTTP(w, r)
	}
	h.unavailable.warn(h.logger, "redis unavailable: answering 503 (fail_closed)",
		zap.String("key", k.lock), zap.Error(err))
	return h.reject(w, repl, resultUnavailable, problemUnavailable)
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

// lockLost logs and counts a lock lost while its request was in flight;
// recordKey is its request's record's key, if it has one.
func (h *Handler) lockLost(lk *engine.Lock, recordKey string, cause error) {
	metrics.lost.Inc()
	h.events.emit(eventLockLost, lk.Key(), recordKey, lk.Fence(), resultLost)
	h.logger.Warn("lock lost while the request was in flight",
		zap.String("key", lk.Key()), zap.Int64("fencing_token", lk.Fence()),
		zap.String("lost_lock", h.LostLock), zap.NamedError("cause", cause))
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
