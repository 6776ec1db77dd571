package lock

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
)

// Defaults used when the corresponding field is zero: a lease of 10s, and
// the Caddy handler's key prefix "redis_lock:".
const (
	DefaultTTL    = engine.DefaultTTL
	DefaultPrefix = engine.DefaultPrefix
)

// NoRenew as Options.Renew turns the keep-alive off: the lease ends at its
// local deadline unless Lock.Refresh extends it.
const NoRenew = engine.NoRenew

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
	// included. On a redis.ClusterClient a call the Cluster refuses while
	// a slot migrates or a master fails over is tried again until then,
	// and an acquire with Wait until the wait's end when that is later.
	// Default 0: only the caller's context and the Redis client's own
	// timeouts bound them, and a call without a deadline is not tried
	// again past go-redis's own retries.
	CallTimeout time.Duration
	// ReleaseTimeout bounds Release, which runs detached from the caller's
	// cancellation. Default 0: CallTimeout, else the Redis client's own
	// read and write timeouts (go-redis: ReadTimeout, 3s unless set).
	ReleaseTimeout time.Duration
	// MaxBackground bounds the give-backs tried at once (never more than
	// 64): after an acquire whose reply did not come (the lock may have
	// been taken), the lock is released in the background, and again while
	// Redis does not answer. The other give-backs wait their turn (up to
	// 10,000; past that the oldest is dropped and the lease ends its
	// lock). Default 64.
	MaxBackground int
	// OnRenew, when set, is called after every keep-alive refresh with nil,
	// ErrNotHeld or an ErrUnavailable error (for metrics).
	OnRenew func(err error)
}

// Locker acquires locks. Client implements it.
type Locker interface {
	Acquire(ctx context.Context, key string, opt Options) (*Lock, error)
}

// Client takes locks on a Backend: it waits for them, bounds each call, and
// cleans up after calls whose reply did not come.
type Client struct {
	c *engine.Client
}

// New returns a Client on one Redis deployment (NewRedis). go-redis may
// retry a command after a network error; every command here is idempotent
// for its own token, so a retry never applies twice.
func New(rdb redis.UniversalClient, cfg *Config) *Client {
	return NewWithBackend(NewRedis(rdb), cfg)
}

// NewWithBackend returns a Client on b: a Redis (NewRedis,
// NewReplicatedRedis) or a Redlock.
func NewWithBackend(b Backend, cfg *Config) *Client {
	var ec *engine.Config
	if cfg != nil {
		c := engine.Config(*cfg)
		ec = &c
	}
	return &Client{c: engine.NewWithBackend(b.backend(), ec)}
}

// Acquire takes the lock named key (a full Redis key, such as one from Key)
// for opt.TTL. The returned lock's Context is derived from ctx and is
// cancelled when the lock is released or lost. On contention it returns a
// *NotObtainedError (errors.Is ErrNotObtained) once opt.Wait has passed.
// When Redis does not answer it returns an error that matches
// ErrUnavailable, and gives back in the background what the attempt may
// have taken.
func (c *Client) Acquire(ctx context.Context, key string, opt Options) (*Lock, error) {
	l, err := c.c.Acquire(ctx, key, engine.Options(opt))
	if err != nil {
		return nil, err
	}
	return &Lock{l: l}, nil
}

var _ Locker = (*Client)(nil)

// Errors callers tell apart with errors.Is. A cancelled or expired caller
// context is reported as context.Canceled or context.DeadlineExceeded.
var (
	// ErrNotObtained: another holder has the lock (after any wait).
	ErrNotObtained = engine.ErrNotObtained
	// ErrNotHeld: the lock is no longer ours (expired, or taken by another).
	ErrNotHeld = engine.ErrNotHeld
	// ErrUnavailable: Redis could not be reached or did not answer in
	// time; on a Redlock, no majority of the masters did.
	ErrUnavailable = engine.ErrUnavailable
	// ErrNotReplicated: a write made on the primary that fewer replicas
	// than NewReplicatedRedis asks for acknowledged in time. An acquire or
	// refresh that fails so matches ErrUnavailable too.
	ErrNotReplicated = engine.ErrNotReplicated
	// ErrLeaseExpired: the local lease deadline passed without a successful
	// refresh. It is the cause of a lost lock's context and matches ErrNotHeld.
	ErrLeaseExpired = engine.ErrLeaseExpired
	// ErrReleased is the cause of a lock context ended by Release.
	ErrReleased = engine.ErrReleased
)

// NotObtainedError carries how long the current holder's lease has left
// (Remaining, 0 when unknown), so a caller can answer with Retry-After. It
// matches ErrNotObtained.
type NotObtainedError = engine.NotObtainedError

// NodeError is the error of one Redlock master (Node, its name; Err).
type NodeError = engine.NodeError

// Lock is a held lock. Its Context ends when the lock is released or lost.
type Lock struct {
	l *engine.Lock
}

// Key is the Redis key of the lock.
func (l *Lock) Key() string { return l.l.Key() }

// Token is the random value that identifies this holder in Redis.
func (l *Lock) Token() string { return l.l.Token() }

// Fence is the fencing token: larger than any earlier holder's of this key.
// It is the Redis clock in microseconds when this lock was taken, or one more
// than the last token issued when that is larger: compare tokens, do not
// count them.
func (l *Lock) Fence() int64 { return l.l.Fence() }

// Context is cancelled when the lock is released or lost, or the context
// given to Acquire ends. context.Cause tells which: ErrReleased, ErrNotHeld
// (Redis reports another holder), ErrLeaseExpired (no successful refresh
// before the local lease deadline) or the parent's error.
func (l *Lock) Context() context.Context { return l.l.Context() }

// Deadline is the local lease deadline: the lock must be treated as lost from
// then on unless a refresh succeeds first.
func (l *Lock) Deadline() time.Time { return l.l.Deadline() }

// Refresh extends the lease to ttl (the acquire TTL when ttl <= 0) if the lock
// is still held, and moves the local deadline from the time it was sent.
func (l *Lock) Refresh(ctx context.Context, ttl time.Duration) error {
	return l.l.Refresh(ctx, ttl)
}

// Release deletes the lock if it is still ours, stops the keep-alive and
// ends the lock's Context (cause ErrReleased). It runs detached from ctx's
// cancellation (the caller may be gone), bounded by the client's
// ReleaseTimeout. It is safe to call more than once; a lock that has
// expired or been taken over reports ErrNotHeld and is left alone.
func (l *Lock) Release(ctx context.Context) error { return l.l.Release(ctx) }
