package lock

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	mrand "math/rand/v2"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
)

// Defaults used when the corresponding field is zero.
const (
	DefaultTTL    = 10 * time.Second
	DefaultPrefix = "redis_lock:"
)

// NoRenew as Options.Renew turns the keep-alive off: the lease ends at its
// local deadline.
const NoRenew time.Duration = -1

// Locker acquires locks. Client implements it on one Redis deployment; a
// Redlock implementation over several independent masters can sit behind the
// same interface.
type Locker interface {
	Acquire(ctx context.Context, key string, opt Options) (*Lock, error)
}

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
	// FenceKey is the fencing counter: the last fencing token issued, one
	// key for all locks of this client, with no TTL. Default:
	// FenceCounterKey(DefaultPrefix), "redis_lock:fence".
	FenceKey string
	// CallTimeout bounds each acquire attempt and each refresh: waiting in
	// a pipeline queue, for a pooled connection, dialling and any retry
	// included. Default 0: only the caller's context and the Redis client's
	// own timeouts bound them.
	CallTimeout time.Duration
	// ReleaseTimeout bounds Release, which runs detached from the caller's
	// cancellation. Default 0: CallTimeout, else the Redis client's own
	// read and write timeouts (go-redis: ReadTimeout, 3s unless set).
	ReleaseTimeout time.Duration
	// MaxBackground bounds the releases running in the background at once:
	// those after an acquire whose reply did not come (the lock may have
	// been taken) and ReleaseAsync. Beyond it they are dropped and the
	// lease ends the lock. Default 64.
	MaxBackground int
	// OnRenew, when set, is called after every keep-alive refresh with nil,
	// ErrNotHeld or an ErrUnavailable error (for metrics).
	OnRenew func(err error)
}

// DefaultMaxBackground is Config.MaxBackground's default.
const DefaultMaxBackground = 64

// Client takes locks on one Redis deployment.
type Client struct {
	rdb   redis.UniversalClient
	async submitter // rdb as a deferred autopipeliner, else nil
	cfg   Config
	bg    chan struct{} // background work running
}

// New returns a Client. For context deadlines to bound each call, create rdb
// with ContextTimeoutEnabled. A deferred autopipeliner (AsyncAutoPipeline)
// shares round trips between concurrent callers, and each call still gives
// up waiting at its deadline. go-redis may retry a command after a network
// error; every command here is idempotent for its own token, so a retry
// never applies twice.
func New(rdb redis.UniversalClient, cfg *Config) *Client {
	c := &Client{rdb: rdb}
	if cfg != nil {
		c.cfg = *cfg
	}
	if s, ok := rdb.(submitter); ok && !s.IsBlocking() {
		c.async = s
	}
	if c.cfg.FenceKey == "" {
		c.cfg.FenceKey = FenceCounterKey(DefaultPrefix)
	}
	if c.cfg.ReleaseTimeout <= 0 {
		c.cfg.ReleaseTimeout = c.cfg.CallTimeout
	}
	if c.cfg.MaxBackground <= 0 {
		c.cfg.MaxBackground = DefaultMaxBackground
	}
	c.bg = make(chan struct{}, c.cfg.MaxBackground)
	return c
}

// Key builds the Redis key for a lock: prefix + "{" + hex(sha256(scope + NUL +
// name)) + "}". Hashing keeps client data out of Redis key names and keys
// fixed-length; the braces are a Cluster hash tag, so the lock and its
// idempotency result share a slot.
func Key(prefix, scope, name string) string {
	h := sha256.New()
	h.Write([]byte(scope))
	h.Write([]byte{0})
	h.Write([]byte(name))
	var sum [sha256.Size]byte
	var hexed [2 * sha256.Size]byte
	hex.Encode(hexed[:], h.Sum(sum[:0]))
	return prefix + "{" + string(hexed[:]) + "}"
}

// FenceCounterKey is the fencing counter of the locks under prefix. It
// cannot collide with a lock key, whose name after the prefix is in braces.
func FenceCounterKey(prefix string) string { return prefix + "fence" }

// Acquire takes the lock named key (a full Redis key, such as one from Key)
// for opt.TTL. The returned lock's Context is derived from ctx and is
// cancelled when the lock is released or lost. On contention it returns a
// *NotObtainedError (errors.Is ErrNotObtained) once opt.Wait has passed.
func (c *Client) Acquire(ctx context.Context, key string, opt Options) (*Lock, error) {
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
	for {
		// Not every client checks the context before sending (go-redis's
		// autopipeliner does not): a caller that is gone takes no lock.
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		sent := time.Now()
		fence, remaining, ok, err := c.acquireOnce(ctx, key, token, ttl)
		if err != nil {
			// The script may have run (or still run: a queued command is
			// sent even after its caller gave up) and only the reply be
			// lost: free what may be ours so a duplicate is not blocked
			// for a lease.
			c.background(ctx, func(ctx context.Context) { _ = c.releaseToken(ctx, key, token) })
			return nil, err
		}
		if ok {
			return newLock(ctx, c, key, token, fence, ttl, renew, sent), nil
		}
		now := time.Now()
		if waitUntil.IsZero() || !now.Before(waitUntil) {
			return nil, &NotObtainedError{Remaining: remaining}
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
		t := time.NewTimer(sleep)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
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

// acquireOnce runs the acquire script: the lock and its fencing token, or the
// holder's remaining lease.
func (c *Client) acquireOnce(ctx context.Context, key, token string, ttl time.Duration) (fence int64, remaining time.Duration, ok bool, err error) {
	cctx, cancel := c.callContext(ctx)
	defer cancel()
	cmd, err := c.runScript(cctx, acquireScript, []string{key, c.cfg.FenceKey}, token, ttl.Milliseconds())
	if err != nil {
		return 0, 0, false, classify(ctx, err)
	}
	res := cmd.Val()
	switch v := res.(type) {
	case string: // ours: the fencing token
		if fence, perr := strconv.ParseInt(v, 10, 64); perr == nil {
			return fence, 0, true, nil
		}
	case int64: // held by another: its PTTL (negative: no TTL, or just gone)
		if v > 0 {
			remaining = time.Duration(v) * time.Millisecond
		}
		return 0, remaining, false, nil
	}
	return 0, 0, false, classify(ctx, fmt.Errorf("unexpected reply from acquire script: %T %v", res, res))
}

// refresh extends key's lease to ttl if it still holds token.
func (c *Client) refresh(ctx context.Context, key, token string, ttl time.Duration) error {
	cctx, cancel := c.callContext(ctx)
	defer cancel()
	cmd, err := c.runScript(cctx, refreshScript, []string{key}, token, ttl.Milliseconds())
	if err != nil {
		return classify(ctx, err)
	}
	n, err := cmd.Int64()
	if err != nil {
		return classify(ctx, err)
	}
	if n != 1 {
		return ErrNotHeld
	}
	return nil
}

// releaseToken deletes key if it still holds token, on a context detached from
// the caller's cancellation, bounded by ReleaseTimeout or the client's
// timeouts.
func (c *Client) releaseToken(ctx context.Context, key, token string) error {
	detached := context.WithoutCancel(ctx)
	rctx := detached
	if c.cfg.ReleaseTimeout > 0 {
		var cancel context.CancelFunc
		rctx, cancel = context.WithTimeout(detached, c.cfg.ReleaseTimeout)
		defer cancel()
	}
	// The lock is a hash whose one field is the holder's token: HDEL
	// deletes it only if the token is ours, and Redis deletes the key with
	// its last field. No script, so no script cache to miss either.
	cmd := redis.NewIntCmd(rctx, "hdel", key, token)
	err := c.process(rctx, cmd)
	if err != nil {
		// The caller's context cannot end a release; the release's own
		// timeout passing means Redis did not answer: ErrUnavailable.
		return classify(detached, err)
	}
	if cmd.Val() != 1 {
		return ErrNotHeld
	}
	return nil
}

var _ Locker = (*Client)(nil)
