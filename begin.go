package redislock

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
	"github.com/reqlock/caddy-redis-lock/internal/redisconn"
	"github.com/reqlock/caddy-redis-lock/record"
)

// begin begins an idempotent request under its record: a new one has its
// record in progress (Pending); a completed one's answer is a
// *record.CompletedError, another request's key record.ErrMismatch, one in
// progress a *engine.NotObtainedError. The record outlives the client: a
// request that begins runs on, and its answer is stored, when the client
// goes away (bounded by the lease and its renewal), so that the client's
// retry gets it. Just after Redis's recovery, the answers other requests got
// while it was away are stored first (settle, beginAgain).
func (h *Handler) begin(r *http.Request, repl *caddy.Replacer, k requestKey, start time.Time) (*record.Pending, error) {
	repl.Set(phRecordKey, k.recordKey())
	ctx := context.WithoutCancel(r.Context())
	recoveredAt := h.conn.Recovery().Last()
	if redisconn.Settle(recoveredAt) {
		metrics.settled.inc(settleWaited)
	}
	pending, err := h.store.Begin(ctx, k.record, k.fingerprint, time.Duration(h.Idempotency.Retention), h.lockOptions())
	if (err == nil || errors.Is(err, record.ErrAbandoned) || errors.Is(err, engine.ErrNotObtained)) && h.conn.Recovery().Last() != recoveredAt {
		pending, err = h.beginAgain(ctx, pending, k.record, k.fingerprint, start)
	}
	return pending, err
}

// beginAgain gives up pending, a request begun as Redis recovered (nil:
// one that found its record in progress under a lease that ran out, or
// abandoned, or held), and begins it again once the answers given while
// Redis was away are stored (settle). Its key may be
// free, or its record abandoned, only because the lease of a holder that
// could not store its answer ran out during the outage; that holder's
// completion, woken by Redis's recovery too, is refused while another
// request holds the key, and lands once this one lets go: a retry that
// reaches Redis just before that completion must get it, not run the
// request again nor be told its outcome is unknown.
//
// A key that could not be given back is answered 503 (errNotGivenBack),
// and given back in the background (giveRecordBack). The second begin
// waits only for what is left of the `wait`.
func (h *Handler) beginAgain(ctx context.Context, pending *record.Pending, rkey, fingerprint string, start time.Time) (*record.Pending, error) {
	at := h.conn.Recovery().Last()
	if pending != nil {
		// Removed on the primary is enough to begin again: a removal the
		// replicas did not acknowledge is written again in the background.
		if err := h.giveRecordBack(ctx, pending); err != nil && !errors.Is(err, engine.ErrNotHeld) && !errors.Is(err, engine.ErrNotReplicated) {
			return nil, fmt.Errorf("%w: %w", errNotGivenBack, err)
		}
	}
	metrics.settled.inc(settleBegunAgain)
	redisconn.Settle(at)
	opt := h.lockOptions()
	opt.Wait = max(opt.Wait-time.Since(start), 0)
	return h.store.Begin(ctx, rkey, fingerprint, time.Duration(h.Idempotency.Retention), opt)
}

// giveRecordBack gives up a record begun for a request that did not run,
// so that its retry runs, and so that the answer of an earlier holder,
// tried again while Redis did not take it, can land. A give-back that Redis
// did not answer, or whose removal the replicas did not acknowledge, goes
// on in the lock client's give-back queue (Lock.GiveBackLater): a record
// left in progress is abandoned once its lease runs out, and its retries
// are answered outcome-unknown although nothing ran. It returns the first
// try's error.
func (h *Handler) giveRecordBack(ctx context.Context, p *record.Pending) error {
	err := p.Release(ctx)
	if errors.Is(err, engine.ErrUnavailable) {
		p.GiveBackLater()
	}
	return err
}

// errNotGivenBack is a key begun as Redis recovered that could not be
// given back for the second begin.
var errNotGivenBack = errors.New("redis_lock: a key begun as Redis recovered could not be given back")
