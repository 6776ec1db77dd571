package record

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/reqlock/caddy-redis-lock/lock"
)

// Errors of Begin, for errors.Is and errors.As.
var (
	// ErrMismatch: the key has a record of a request with another
	// fingerprint (the same key reused for a different request).
	ErrMismatch = errors.New("record: idempotency key reused with another request")
	// ErrNotStored: Complete found the record no longer ours (its lease
	// ran out and another request took the key).
	ErrNotStored = errors.New("record: outcome not stored, the record is no longer ours")
)

// CompletedError is what Begin returns when the key's request has already
// completed with the same fingerprint: its stored Response.
type CompletedError struct{ Response *Response }

func (e *CompletedError) Error() string {
	return fmt.Sprintf("record: request already completed (status %d)", e.Response.Status)
}

// Key is the record's Redis key for a lock key: it keeps the lock's Cluster
// hash tag, so that one script can touch both.
func Key(lockKey string) string { return lockKey + ":result" }

// Store keeps records beside the locks of a Client on one Redis deployment.
type Store struct {
	c *lock.Client
	r *lock.Redis
}

// NewStore returns the Store of c, whose Backend must be a *lock.Redis.
func NewStore(c *lock.Client) (*Store, error) {
	r, ok := c.Backend().(*lock.Redis)
	if !ok {
		return nil, fmt.Errorf("record: a Store needs a lock.Client on one Redis deployment, not %T", c.Backend())
	}
	return &Store{c: c, r: r}, nil
}

// Begin starts the request with fingerprint under key (a lock key), in one
// round trip. When the request is new, it returns the held lock, the
// record now in progress beside it. Otherwise it returns a *CompletedError
// with the stored response, ErrMismatch when the key's record has another
// fingerprint, or a *lock.NotObtainedError while another request with the
// same fingerprint is in progress (after opt.Wait, during which a
// completion ends the wait with its response). fingerprint is 64 hex
// digits (a SHA-256).
func (s *Store) Begin(ctx context.Context, key, fingerprint string, opt lock.Options) (*lock.Lock, error) {
	if len(fingerprint) != fingerprintLen {
		return nil, fmt.Errorf("record: fingerprint of %d characters, want %d", len(fingerprint), fingerprintLen)
	}
	return s.c.AcquireWith(ctx, &begin{s: s, fingerprint: fingerprint}, key, opt)
}

// Complete stores resp as the outcome of lk's request for retention and
// releases lk, in one script; lk's keep-alive stops first. Like a release it
// runs detached from ctx's cancellation, bounded by the Client's
// ReleaseTimeout. It returns ErrNotStored when the record is no longer
// lk's, and an ErrUnavailable error when Redis did not answer.
func (s *Store) Complete(ctx context.Context, lk *lock.Lock, fingerprint string, resp *Response, retention time.Duration) error {
	lk.Stop()
	rctx, cancel := s.c.ReleaseContext(ctx)
	defer cancel()
	cmd, err := s.r.Run(rctx, completeScript, []string{lk.Key(), Key(lk.Key())},
		lk.Token(), retention.Milliseconds(), encode(fingerprint, resp))
	if err != nil {
		return fmt.Errorf("%w: %w", lock.ErrUnavailable, err)
	}
	if n, _ := cmd.Int64(); n != 1 {
		return ErrNotStored
	}
	return nil
}

// Abandon gives up lk's request with nothing to keep (the backend was never
// reached, or answered "try again"): the in-progress record is deleted and
// the lock released, so that a retry runs. It is lk.Release.
func (s *Store) Abandon(ctx context.Context, lk *lock.Lock) error { return lk.Release(ctx) }

// classify makes a Redis error ErrUnavailable, keeping the caller's own
// context errors.
func classify(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("%w: %w", lock.ErrUnavailable, err)
}

// begin is the Backend of one Begin: the lock taken with the record, and
// refreshed and released with it.
type begin struct {
	s           *Store
	fingerprint string
}

func (b *begin) TryAcquire(ctx context.Context, key, token string, ttl time.Duration) (int64, error) {
	cmd, err := b.s.r.Run(ctx, beginScript, []string{key, b.s.r.FenceKey(), Key(key)},
		token, ttl.Milliseconds(), b.fingerprint)
	if err != nil {
		return 0, classify(ctx, err)
	}
	if v, ok := cmd.Val().(string); ok && v != "" {
		switch v[0] {
		case 'M':
			return 0, ErrMismatch
		case 'C':
			_, resp, err := decode([]byte(v))
			if err != nil {
				return 0, err
			}
			return 0, &CompletedError{Response: resp}
		}
	}
	return lock.ParseGrant(ctx, cmd.Val())
}

func (b *begin) Refresh(ctx context.Context, key, token string, ttl time.Duration) error {
	cmd, err := b.s.r.Run(ctx, refreshScript, []string{key, Key(key)}, token, ttl.Milliseconds())
	if err != nil {
		return classify(ctx, err)
	}
	if n, _ := cmd.Int64(); n != 1 {
		return lock.ErrNotHeld
	}
	return nil
}

func (b *begin) Release(ctx context.Context, key, token string) error {
	cmd, err := b.s.r.Run(ctx, abandonScript, []string{key, Key(key)}, token)
	if err != nil {
		return classify(ctx, err)
	}
	if n, _ := cmd.Int64(); n != 1 {
		return lock.ErrNotHeld
	}
	return nil
}

var _ lock.Backend = (*begin)(nil)
