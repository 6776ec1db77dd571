package engine

import (
	"errors"
	"fmt"
	"time"

	"github.com/reqlock/caddy-redis-lock/internal/redisscript"
)

// Errors callers tell apart with errors.Is. A cancelled or expired caller
// context is reported as context.Canceled or context.DeadlineExceeded.
var (
	// ErrNotObtained: another holder has the lock (after any wait).
	ErrNotObtained = errors.New("redislock: lock not obtained")
	// ErrNotHeld: the lock is no longer ours (expired, or taken by another).
	ErrNotHeld = errors.New("redislock: lock not held")
	// ErrUnavailable: Redis could not be reached or did not answer in time.
	ErrUnavailable = redisscript.ErrUnavailable
	// ErrNotReplicated: a write made on the primary that fewer replicas
	// than NewReplicatedRedis asks for acknowledged in time. An acquire or
	// refresh that fails so matches ErrUnavailable too.
	ErrNotReplicated = redisscript.ErrNotReplicated
	// ErrLeaseExpired: the local lease deadline passed without a successful
	// refresh. It is the cause of a lost lock's context and matches ErrNotHeld.
	ErrLeaseExpired = fmt.Errorf("%w: local lease deadline passed", ErrNotHeld)
	// ErrReleased is the cause of a lock context ended by Release.
	ErrReleased = errors.New("redislock: lock released")
	// ErrByMajority is matched by a backend's own answer that, in Redlock
	// mode, ends an acquire only when a majority of the masters give it
	// (package record's abandoned record: a master may keep one only
	// because its holder never had the majority). Fewer count as
	// refusals.
	ErrByMajority = errors.New("redislock: an answer a majority of the masters decides")
)

// NotObtainedError carries how long the current holder's lease has left, so a
// caller can answer with Retry-After. It matches ErrNotObtained.
type NotObtainedError struct {
	// Remaining is the holder's remaining lease; 0 when unknown.
	Remaining time.Duration
}

func (e *NotObtainedError) Error() string {
	return fmt.Sprintf("%v (held for another %v)", ErrNotObtained, e.Remaining)
}

// Is makes errors.Is(err, ErrNotObtained) true.
func (e *NotObtainedError) Is(target error) bool { return target == ErrNotObtained }
