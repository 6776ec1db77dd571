package engine

import (
	"context"
	"time"
)

// Backend is where locks live: one Redis deployment (Redis), or a store
// that keeps more beside each lock in the same scripts (the idempotency
// records of package record). A Lock refreshes and releases through the
// Backend that granted it, so one Client and one Lock type serve them all.
type Backend interface {
	// TryAcquire makes one attempt to take key for token with a lease of
	// ttl and returns the lock's fencing token. When another holder has
	// the lock it returns a *NotObtainedError. An error that wraps
	// ErrUnavailable, or the context's own, means the attempt may have
	// taken the lock all the same; any other error is an answer of the
	// backend's own and ends a wait.
	TryAcquire(ctx context.Context, key, token string, ttl time.Duration) (int64, error)
	// Refresh sets key's lease to ttl if token holds it, else ErrNotHeld.
	Refresh(ctx context.Context, key, token string, ttl time.Duration) error
	// Release deletes key if token holds it, else ErrNotHeld.
	Release(ctx context.Context, key, token string) error
}

// Placed is a Backend that tells where its locks live (Redis and Redlock
// do), for package record, which keeps its records beside them.
type Placed interface {
	Backend
	Masters() Masters
}

// Masters is where a Placed's locks live: the Redis of each master, in
// order (one without Redlock), the names that label them in errors, and
// how many of them make a majority.
type Masters struct {
	Nodes  []*Redis
	Names  []string
	Quorum int
}
