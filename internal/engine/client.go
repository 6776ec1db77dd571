package engine

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/reqlock/caddy-redis-lock/internal/redisscript"
)

// Defaults used when the corresponding field is zero.
const (
	DefaultTTL    = 10 * time.Second
	DefaultPrefix = "redis_lock:"
)

// NoRenew as Options.Renew turns the keep-alive off: the lease ends at its
// local deadline.
const NoRenew time.Duration = -1

// Options for one Acquire.
type Options struct {
	// TTL is the lease. Default 10s.
	TTL time.Duration
	// Renew is the keep-alive interval. Default TTL/3; NoRenew disables it.
	Renew time.Duration
	// Wait bounds how long Acquire waits for a held lock before it returns
	// ErrNotObtained. Default 0: do not wait.
	Wait time.Duration
}

// Config for a Client.
type Config struct {
	// CallTimeout bounds each acquire attempt and each refresh: waiting in
	// a pipeline queue, for a pooled connection, dialling and any retry
	// included (on a Cluster, the retries of a call it did not run: a slot
	// migrating, a failover). An acquire with Wait may take what is left
	// of the wait instead, when that is longer. Default 0: only the
	// caller's context and the Redis client's own timeouts bound them, and
	// a Cluster's refusals are not retried past go-redis's own.
	CallTimeout time.Duration
	// ReleaseTimeout bounds Release, which runs detached from the caller's
	// cancellation. Default 0: CallTimeout, else the Redis client's own
	// read and write timeouts (go-redis: ReadTimeout, 3s unless set).
	ReleaseTimeout time.Duration
	// MaxBackground bounds the work running in the background at once:
	// ReleaseAsync and Background's callers; beyond it such work is
	// dropped and the lease ends the lock. The give-backs after an acquire
	// whose reply did not come (the lock may have been taken), tried again
	// while Redis does not answer, have a bound of their own, as large but
	// at most 64 tried at once (maxGiveBackWorkers), so that they never
	// crowd out the rest (a stored answer written again, say); the others
	// wait their turn (giveBacks). Default 64.
	MaxBackground int
	// OnRenew, when set, is called after every keep-alive refresh with nil,
	// ErrNotHeld or an ErrUnavailable error (for metrics).
	OnRenew func(err error)
}

// defaultMaxBackground is Config.MaxBackground's default.
const defaultMaxBackground = 64

// Client takes locks on a Backend: it waits for them, bounds each call, and
// cleans up after calls whose reply did not come.
type Client struct {
	b   Backend
	cfg Config
	bg  chan struct{} // background work running
	gb  giveBacks     // tokens whose acquire did not answer, until given back
}

// New returns a Client on one Redis deployment (NewRedis). go-redis may
// retry a command after a network error; every command here is idempotent
// for its own token, so a retry never applies twice.
func New(rdb redis.UniversalClient, cfg *Config) *Client {
	return NewWithBackend(NewRedis(rdb), cfg)
}

// NewWithBackend returns a Client on b.
func NewWithBackend(b Backend, cfg *Config) *Client {
	c := &Client{b: b}
	if cfg != nil {
		c.cfg = *cfg
	}
	if c.cfg.ReleaseTimeout <= 0 {
		c.cfg.ReleaseTimeout = c.cfg.CallTimeout
	}
	if c.cfg.MaxBackground <= 0 {
		c.cfg.MaxBackground = defaultMaxBackground
	}
	c.bg = make(chan struct{}, c.cfg.MaxBackground)
	c.gb.c = c
	return c
}

// Backend is the backend the Client takes its locks on.
func (c *Client) Backend() Backend { return c.b }

// Config is the Client's configuration, with its defaults applied.
func (c *Client) Config() Config { return c.cfg }

// Acquire takes the lock named key (a full Redis key, such as one from Key)
// for opt.TTL. The returned lock's Context is derived from ctx and is
// cancelled when the lock is released or lost. On contention it returns a
// *NotObtainedError (errors.Is ErrNotObtained) once opt.Wait has passed.
func (c *Client) Acquire(ctx context.Context, key string, opt Options) (*Lock, error) {
	return c.AcquireWith(ctx, c.b, key, opt)
}

// AcquireWith is Acquire on b, a backend made for this one call (one that
// does more in the same script, say), with the Client's timeouts and
// limits. The lock refreshes and releases through b. An error of b's own
// (not ErrUnavailable, not a *NotObtainedError) ends a wait and is
// returned as it is.
func (c *Client) AcquireWith(ctx context.Context, b Backend, key string, opt Options) (*Lock, error) {
	ttl := opt.TTL
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	renew := opt.Renew
	if renew == 0 {
		renew = ttl / 3
	}
	token := newToken()
	var waitUntil time.Time
	if opt.Wait > 0 {
		waitUntil = time.Now().Add(opt.Wait)
	}
	backoff := minBackoff
	// A waiter subscribes to the lock's releases after its first refusal,
	// and its attempts from then on mark the lock as waited for: the
	// release wakes it. Polling goes on beside, for a wake-up that is lost.
	attemptCtx := ctx
	var woken <-chan struct{}
	watched := false
	for {
		// Not every client checks the context before sending (go-redis's
		// autopipeliner does not): a caller that is gone takes no lock.
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		sent := time.Now()
		cctx, cancel := c.attemptContext(attemptCtx, waitUntil)
		fence, err := b.TryAcquire(cctx, key, token, ttl)
		cancel()
		if err == nil {
			return newLock(ctx, c, b, key, token, fence, ttl, renew, sent), nil
		}
		var notObtained *NotObtainedError
		if !errors.As(err, &notObtained) {
			err = c.reclassify(ctx, err)
			if errors.Is(err, ErrUnavailable) || ctx.Err() != nil {
				// The script may have run (or still run: a queued
				// command is sent even after its caller gave up) and
				// only the reply be lost: free what may be ours so a
				// duplicate is not blocked for a lease, and mark the
				// token given back for an attempt that runs later.
				c.giveBackUntilAnswered(b, key, token, ttl)
			}
			return nil, err
		}
		remaining := notObtained.Remaining
		now := time.Now()
		if waitUntil.IsZero() || !now.Before(waitUntil) {
			return nil, notObtained
		}
		if !watched {
			watched = true
			var stop func()
			if woken, stop = c.watch(ctx, b, key); stop != nil {
				defer stop()
				// At once: the release may have come before the
				// subscription, which would not hear of it.
				attemptCtx = withWaiting(ctx)
				continue
			}
		}
		// Full jitter on an exponential step, never past the wait or the
		// holder's lease. All state is local to this call.
		sleep := backoff/2 + mrand.N(backoff/2+1)
		if remaining > 0 && remaining < sleep {
			sleep = remaining
		}
		if left := waitUntil.Sub(now); left < sleep {
			sleep = left
		}
		backoff = min(2*backoff, maxBackoff)
		if err := sleepOrWake(ctx, sleep, woken); err != nil {
			return nil, err
		}
	}
}

// newToken returns a random UUIDv4 string, with one allocation (uuid's own
// NewString takes two).
func newToken() string {
	var u uuid.UUID
	_, _ = rand.Read(u[:])  // crypto/rand.Read never fails (Go 1.24+)
	u[6] = u[6]&0x0f | 0x40 // version 4
	u[8] = u[8]&0x3f | 0x80 // RFC 4122 variant
	return u.String()
}

const (
	minBackoff = 8 * time.Millisecond
	maxBackoff = 256 * time.Millisecond
)

// callContext bounds one call to the backend by CallTimeout, when set.
func (c *Client) callContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if c.cfg.CallTimeout > 0 {
		return context.WithTimeout(ctx, c.cfg.CallTimeout)
	}
	return ctx, func() {}
}

// attemptContext bounds one acquire attempt: by CallTimeout, or by what is
// left of the wait (waitUntil) when that is longer. A caller that agreed to
// wait for a held lock waits as long for a Cluster that asks to try again
// (a slot migrating, a master failing over), which the backend does until
// the attempt's deadline (redisscript's retry).
func (c *Client) attemptContext(ctx context.Context, waitUntil time.Time) (context.Context, context.CancelFunc) {
	if c.cfg.CallTimeout <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, max(c.cfg.CallTimeout, time.Until(waitUntil)))
}

// reclassify makes an error of a call that ended on its own deadline (not
// the caller's context) ErrUnavailable: Redis did not answer in time.
func (c *Client) reclassify(ctx context.Context, err error) error {
	if err == nil || errors.Is(err, ErrUnavailable) {
		return err
	}
	if ctx.Err() == nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) {
		// What a Cluster answered while the call was retried stays
		// matchable (ErrNotReplicated); the internal deadline does not.
		var re *redisscript.RetryError
		if errors.As(err, &re) {
			return fmt.Errorf("%w: %w", ErrUnavailable, re)
		}
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	return err
}

// refresh extends key's lease on b, bounded by CallTimeout.
func (c *Client) refresh(ctx context.Context, b Backend, key, token string, ttl time.Duration) error {
	cctx, cancel := c.callContext(ctx)
	defer cancel()
	return c.reclassify(ctx, b.Refresh(cctx, key, token, ttl))
}

// release deletes key on b if it still holds token, on a context detached
// from the caller's cancellation, bounded by ReleaseTimeout.
func (c *Client) release(ctx context.Context, b Backend, key, token string) error {
	return c.releaseCall(ctx, func(rctx context.Context) error { return b.Release(rctx, key, token) })
}

// releaseCall runs call, a release, on the releaseContext of ctx. The caller's
// context cannot end it; its own timeout passing means Redis did not
// answer: ErrUnavailable.
func (c *Client) releaseCall(ctx context.Context, call func(context.Context) error) error {
	rctx, cancel := c.releaseContext(ctx)
	defer cancel()
	return c.reclassify(context.WithoutCancel(ctx), call(rctx))
}

// releaseContext is the context a release runs on: detached from ctx's
// cancellation (the caller may be gone), bounded by ReleaseTimeout.
func (c *Client) releaseContext(ctx context.Context) (context.Context, context.CancelFunc) {
	detached := context.WithoutCancel(ctx)
	if c.cfg.ReleaseTimeout > 0 {
		return context.WithTimeout(detached, c.cfg.ReleaseTimeout)
	}
	return detached, func() {}
}

// Background runs f on a context detached from ctx's cancellation, unless
// MaxBackground calls (ReleaseAsync's included; give-backs have a bound of
// their own) are already running: then f is dropped, as the lease ends
// what it would have cleaned up. It reports whether f runs. For work a
// caller finishes after it has answered, such as storing an outcome once
// Redis is back (package record's users).
func (c *Client) Background(ctx context.Context, f func(context.Context)) bool {
	select {
	case c.bg <- struct{}{}:
	default:
		return false
	}
	go func() {
		defer func() { <-c.bg }()
		f(context.WithoutCancel(ctx))
	}()
	return true
}
