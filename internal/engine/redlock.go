package engine

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
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

// attempt is one acquire of a key and token on every master. A call
// returns once a majority decided, so a master may answer after it. A
// release of that master waits until it settled, or the release could reach
// it first and the late acquire leave the lock there for its whole lease.
// The next acquire of the same token (a retry) on that master waits too,
// until what a failed attempt took there is given back, or the late
// give-back could delete the retry's grant; the other masters do not wait.
type attempt struct {
	settled []chan struct{} // closed when that master answered and, if the attempt failed, gave back
	left    atomic.Int32    // masters not settled yet
	stop    context.CancelFunc
}

func newAttempt(n int, stop context.CancelFunc) *attempt {
	at := &attempt{settled: make([]chan struct{}, n), stop: stop}
	for i := range n {
		at.settled[i] = make(chan struct{})
	}
	at.left.Store(int32(n))
	return at
}

// settle marks master i settled, and drops at from rl after the last one,
// unless a later attempt took its place.
func (rl *Redlock) settle(id string, at *attempt, i int) {
	close(at.settled[i])
	if at.left.Add(-1) == 0 {
		at.stop()
		rl.attempts.CompareAndDelete(id, at)
	}
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

// TryAcquire takes key on a majority within the validity time and returns
// the largest fencing token the majority issued, written back to a
// majority. A master's own answer (neither contention nor failure) ends the
// attempt and is returned. When requests for one key split the masters'
// votes so that none has a majority, each gives back what it took and
// tries again after a random pause, a few times, as Redlock prescribes.
func (rl *Redlock) TryAcquire(ctx context.Context, key, token string, ttl time.Duration) (int64, error) {
	for attempt := 1; ; attempt++ {
		fence, granted, err := rl.tryAcquire(ctx, key, token, ttl)
		var ne *NotObtainedError
		if granted == 0 || !errors.As(err, &ne) || attempt == splitVoteAttempts {
			return fence, err
		}
		t := time.NewTimer(time.Duration(rand.Int64N(int64(splitVotePause))))
		select {
		case <-ctx.Done():
			t.Stop()
			return 0, err
		case <-t.C:
		}
	}
}

// A split vote is tried again up to splitVoteAttempts times in all, after a
// random pause of up to splitVotePause.
const (
	splitVoteAttempts = 4
	splitVotePause    = 20 * time.Millisecond
)

// tryAcquire is one attempt of TryAcquire; granted is how many masters gave
// the lock (all of it given back unless err is nil).
func (rl *Redlock) tryAcquire(ctx context.Context, key, token string, ttl time.Duration) (fence int64, granted int, err error) {
	id := key + "\x00" + token
	var prev *attempt
	if p, ok := rl.attempts.Load(id); ok {
		prev = p.(*attempt)
	}
	// The masters' calls outlive the caller's return (a majority or a
	// stored result decided first, or the caller left), bounded by ctx's
	// deadline: a master that answers late is then known to have granted,
	// refused or answered with a stored result, and only a grant or a
	// failure is given back. Cut off, every late call would need a release.
	callCtx, stop := detached(ctx, ttl)
	at := newAttempt(len(rl.nodes), stop)
	rl.attempts.Store(id, at)
	start := time.Now()
	replies := rl.fanOut(func(i int, n Master) (int64, error) {
		if prev != nil {
			select {
			case <-prev.settled[i]:
			case <-callCtx.Done():
				return 0, fmt.Errorf("%w: the last attempt on this master is not settled: %w", ErrUnavailable, callCtx.Err())
			}
		}
		return n.TryAcquire(callCtx, key, token, ttl)
	})
	answers := make([]*reply, len(rl.nodes))
	refused := 0
	var remaining time.Duration
	var errs []error
	for range rl.nodes {
		var r reply
		select {
		case r = <-replies:
		case <-ctx.Done():
			rl.giveBack(ctx, id, key, token, ttl, at, answers, replies)
			return 0, granted, fmt.Errorf("%w: no majority of the masters answered: %w", ErrUnavailable, ctx.Err())
		}
		answers[r.node] = &r
		var ne *NotObtainedError
		switch {
		case r.err == nil:
			granted++
			fence = max(fence, r.fence)
		case errors.As(r.err, &ne):
			refused++
			remaining = max(remaining, ne.Remaining)
		case errors.Is(r.err, ErrUnavailable) || ctx.Err() != nil:
			errs = append(errs, rl.nodeError(r.node, r.err))
		default: // an answer of the node's own, such as a stored result
			rl.giveBack(ctx, id, key, token, ttl, at, answers, replies)
			return 0, 0, r.err
		}
		if granted >= rl.quorum || len(errs)+refused > len(rl.nodes)-rl.quorum {
			break
		}
	}
	validity := ttl - time.Since(start) - leaseMargin(ttl)
	switch {
	case granted >= rl.quorum && validity > 0:
		if err := rl.raiseFence(ctx, key, fence, ttl); err != nil {
			rl.giveBack(ctx, id, key, token, ttl, at, answers, replies)
			return 0, granted, err
		}
		// Late answers are grants of this lock, or nothing to give back.
		pending := 0
		for i, r := range answers {
			if r == nil {
				pending++
			} else {
				rl.settle(id, at, i)
			}
		}
		if pending > 0 {
			go func() {
				for range pending {
					rl.settle(id, at, (<-replies).node)
				}
			}()
		}
		return fence, granted, nil
	case granted >= rl.quorum:
		rl.giveBack(ctx, id, key, token, ttl, at, answers, replies)
		return 0, granted, fmt.Errorf("%w: a majority granted the lock after its validity time", ErrUnavailable)
	}
	rl.giveBack(ctx, id, key, token, ttl, at, answers, replies)
	if len(errs) <= len(rl.nodes)-rl.quorum {
		return 0, granted, &NotObtainedError{Remaining: remaining}
	}
	return 0, granted, fmt.Errorf("%w: no majority of the masters answered: %w", ErrUnavailable, errors.Join(errs...))
}

// raiseFence writes fence back to the counters of a majority, and returns
// as soon as a majority took the token or too many failed for one to. The
// calls run detached from ctx's cancellation, bounded by its deadline (else
// by ttl), and outlive the return: the caller's call context ends once the
// acquire returns, and a master that answers after the majority must still
// get the token, or its counter lags behind the others'. A late write is
// harmless: raise.lua only ever raises a counter.
func (rl *Redlock) raiseFence(ctx context.Context, key string, fence int64, ttl time.Duration) error {
	callCtx, cancel := detached(ctx, ttl)
	ok, errs := quorum.CallOrGiveUp(callCtx, cancel, len(rl.nodes), rl.quorum, func(ctx context.Context, i int) (bool, error) {
		if err := rl.nodes[i].RaiseFence(ctx, key, fence); err != nil {
			return false, rl.nodeError(i, err)
		}
		return true, nil
	})
	if ok >= rl.quorum {
		return nil
	}
	return fmt.Errorf("%w: the fencing token could not be written back to a majority: %w", ErrUnavailable, errors.Join(errs...))
}

// giveBack releases what a failed attempt took: at once, within ctx's
// deadline, on the masters that granted it; in the background, within a
// lease from now, on those that failed (their write may have landed) and on
// those yet to answer once they granted or failed, as a master that hangs
// must not hold the caller (and its late answer may come at ctx's deadline).
// A master that refused, or gave an answer of its own (a stored result),
// took nothing. Each master settles when its part is done.
func (rl *Redlock) giveBack(ctx context.Context, id, key, token string, ttl time.Duration, at *attempt, answers []*reply, replies <-chan reply) {
	release := func(ctx context.Context, r reply) {
		switch {
		case r.err == nil:
			_ = rl.nodes[r.node].Release(ctx, key, token)
		case errors.Is(r.err, ErrUnavailable) ||
			errors.Is(r.err, context.Canceled) || errors.Is(r.err, context.DeadlineExceeded):
			// The acquire may still run there, after this.
			_ = giveBackOn(ctx, rl.nodes[r.node], key, token, ttl)
		}
		rl.settle(id, at, r.node)
	}
	nowCtx, nowCancel := detached(ctx, ttl)
	defer nowCancel()
	laterCtx, laterCancel := context.WithTimeout(context.WithoutCancel(ctx), ttl)
	var now, later sync.WaitGroup
	pending := 0
	for _, r := range answers {
		switch {
		case r == nil:
			pending++
		case r.err == nil:
			now.Go(func() { release(nowCtx, *r) })
		default:
			later.Go(func() { release(laterCtx, *r) })
		}
	}
	for range pending {
		later.Go(func() { release(laterCtx, <-replies) })
	}
	now.Wait()
	go func() {
		later.Wait()
		laterCancel()
	}()
}

// detached is ctx without its cancellation, bounded by its deadline, else
// by ttl (a grant later than that has expired).
func detached(ctx context.Context, ttl time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return withoutCancel(ctx)
	}
	return context.WithTimeout(context.WithoutCancel(ctx), ttl)
}

// withoutCancel is ctx without its cancellation, bounded by its deadline if
// it has one.
func withoutCancel(ctx context.Context) (context.Context, context.CancelFunc) {
	if d, ok := ctx.Deadline(); ok {
		return context.WithDeadline(context.WithoutCancel(ctx), d)
	}
	return context.WithCancel(context.WithoutCancel(ctx))
}

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
