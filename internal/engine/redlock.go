package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/caddy-redis-lock/internal/quorum"
)

// Redlock is the Backend of N independent Redis masters (N odd, at least
// 3), after antirez's Redlock: a lock is held when a majority of the masters
// granted it within its validity time (ttl - elapsed - drift, drift =
// ttl/100 + 2ms, which is the local lease margin). Refresh needs a
// majority too; release goes to all.
//
// Fencing tokens stay strictly increasing across holders even when the
// masters' clocks or counters differ: the token is the largest the majority
// issued, and it is written back to a majority of the counters before the
// lock is granted, so that every later majority, which shares at least one
// master with it, issues a larger one.
//
// Redlock is weaker than one Redis with fencing: its safety rests on
// bounded clock drift and process pauses (see Kleppmann's "How to do
// distributed locking" and antirez's reply). Pass the fencing token on.
type Redlock struct {
	nodes  []Master
	names  []string
	quorum int

	// attempts holds the *attempt of each key and token whose acquire is
	// not settled on every master yet.
	attempts sync.Map
}

// Master is the Backend of one Redlock master, which can also raise its
// fencing counter to a token issued elsewhere (as *Redis does): a Redlock
// writes its winning token back to a majority of the counters.
type Master interface {
	Backend
	// RaiseFence sets the fencing counter of key to fence unless it is
	// already at or above it.
	RaiseFence(ctx context.Context, key string, fence int64) error
	// Node is the Redis the master's locks live on.
	Node() *Redis
}

// NewRedlock returns the Redlock of the clients, one per master; names
// (their addresses) label errors.
func NewRedlock(clients []redis.UniversalClient, names []string) (*Redlock, error) {
	nodes := make([]Master, len(clients))
	for i, c := range clients {
		nodes[i] = NewRedis(c)
	}
	return NewRedlockOf(nodes, names)
}

// NewRedlockOf returns the Redlock of nodes, one per master: for a package
// whose own Backend does more per master in the same scripts.
func NewRedlockOf(nodes []Master, names []string) (*Redlock, error) {
	if n := len(nodes); n < 3 || n%2 == 0 {
		return nil, fmt.Errorf("redislock: Redlock needs an odd number of masters, at least 3, not %d", n)
	}
	if len(names) != len(nodes) {
		return nil, fmt.Errorf("redislock: %d names for %d masters", len(names), len(nodes))
	}
	return &Redlock{nodes: nodes, names: names, quorum: len(nodes)/2 + 1}, nil
}

// Masters are the Redis of the masters (their Node), their names and the
// quorum.
func (rl *Redlock) Masters() Masters {
	nodes := make([]*Redis, len(rl.nodes))
	for i, n := range rl.nodes {
		nodes[i] = n.Node()
	}
	return Masters{Nodes: nodes, Names: rl.names, Quorum: rl.quorum}
}

// NodeError is the error of one master.
type NodeError struct {
	Node string
	Err  error
}

func (e *NodeError) Error() string { return "master " + e.Node + ": " + e.Err.Error() }
func (e *NodeError) Unwrap() error { return e.Err }

// reply is one master's answer to a call.
type reply struct {
	node  int
	fence int64
	err   error
}

// fanOut calls f on every master at once and sends the replies as they
// come; the channel has room for all of them, so that callers may stop
// reading early.
func (rl *Redlock) fanOut(f func(i int, n Master) (int64, error)) <-chan reply {
	ch := make(chan reply, len(rl.nodes))
	for i, n := range rl.nodes {
		go func() {
			fence, err := f(i, n)
			ch <- reply{i, fence, err}
		}()
	}
	return ch
}

func (rl *Redlock) nodeError(i int, err error) error { return &NodeError{Node: rl.names[i], Err: err} }

// Refresh extends the lease on a majority.
func (rl *Redlock) Refresh(ctx context.Context, key, token string, ttl time.Duration) error {
	replies := rl.fanOut(func(_ int, n Master) (int64, error) { return 0, n.Refresh(ctx, key, token, ttl) })
	ok, notHeld := 0, 0
	var errs []error
	for range rl.nodes {
		r := <-replies
		switch {
		case r.err == nil:
			ok++
		case errors.Is(r.err, ErrNotHeld):
			notHeld++
		default:
			errs = append(errs, rl.nodeError(r.node, r.err))
		}
		switch {
		case ok >= rl.quorum:
			return nil
		case notHeld > len(rl.nodes)-rl.quorum:
			return ErrNotHeld
		case notHeld+len(errs) > len(rl.nodes)-rl.quorum:
			return fmt.Errorf("%w: no majority refreshed: %w", ErrUnavailable, errors.Join(errs...))
		}
	}
	return ErrUnavailable // not reached: the cases above decide by the last reply
}

// Release deletes the lock on every master; it is released when a majority
// deleted it, which it returns as soon as they did: a master that hangs
// does not hold the caller. The other masters' releases go on, within
// ctx's deadline, after Release returned. A master still answering the
// acquire is released once it answered (and settled).
func (rl *Redlock) Release(ctx context.Context, key, token string) error {
	return rl.release(ctx, key, token, false, func(ctx context.Context, m Master) error { return m.Release(ctx, key, token) })
}

// GiveBack is Release for a token whose acquire did not answer in time,
// through each master's GiveBack (Redis's), so that an acquire that runs
// there later takes nothing. It is done once a majority answered, released
// or marked where the lock was not taken (ErrNotHeld then): an acquire that
// runs late on the others takes a minority, which no Redlock acquire
// counts, so the Client need not try the give-back again for a master that
// stays down.
func (rl *Redlock) GiveBack(ctx context.Context, key, token string, ttl time.Duration) error {
	return rl.release(ctx, key, token, true, func(ctx context.Context, m Master) error { return giveBackOn(ctx, m, key, token, ttl) })
}

// release is Release with del as each master's release; majorityDone, a
// give-back's: a majority that answered is enough.
func (rl *Redlock) release(ctx context.Context, key, token string, majorityDone bool, del func(context.Context, Master) error) error {
	rctx, cancel := withoutCancel(ctx)
	var settled []chan struct{}
	if at, ok := rl.attempts.Load(key + "\x00" + token); ok {
		settled = at.(*attempt).settled
	}
	released, errs := quorum.Call(rctx, cancel, len(rl.nodes), rl.quorum, func(ctx context.Context, i int) (bool, error) {
		if settled != nil {
			select {
			case <-settled[i]:
			case <-ctx.Done():
				return false, rl.nodeError(i, ctx.Err())
			}
		}
		switch err := del(ctx, rl.nodes[i]); {
		case errors.Is(err, ErrNotHeld):
			return false, nil
		case err != nil:
			return false, rl.nodeError(i, err)
		}
		return true, nil
	})
	if released >= rl.quorum {
		return nil
	}
	// Short of a majority released, every call has returned.
	if len(errs) > 0 && !(majorityDone && len(rl.nodes)-len(errs) >= rl.quorum) {
		return fmt.Errorf("%w: released on %d of %d masters: %w", ErrUnavailable, released, len(rl.nodes), errors.Join(errs...))
	}
	return ErrNotHeld
}

var (
	_ Placed = (*Redlock)(nil)
	_ Master = (*Redis)(nil)
)
