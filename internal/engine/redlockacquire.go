package engine

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/reqlock/caddy-redis-lock/internal/quorum"
)

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
	v, err := rl.count(ctx, replies)
	if err != nil {
		rl.giveBack(ctx, id, key, token, ttl, at, v.answers, replies)
		return 0, v.granted, err
	}
	validity := ttl - time.Since(start) - leaseMargin(ttl)
	switch {
	case v.granted >= rl.quorum && validity > 0:
		if err := rl.raiseFence(ctx, key, v.fence, ttl); err != nil {
			rl.giveBack(ctx, id, key, token, ttl, at, v.answers, replies)
			return 0, v.granted, err
		}
		rl.settleGranted(id, at, v.answers, replies)
		return v.fence, v.granted, nil
	case v.granted >= rl.quorum:
		rl.giveBack(ctx, id, key, token, ttl, at, v.answers, replies)
		return 0, v.granted, fmt.Errorf("%w: a majority granted the lock after its validity time", ErrUnavailable)
	}
	rl.giveBack(ctx, id, key, token, ttl, at, v.answers, replies)
	if len(v.errs) <= len(rl.nodes)-rl.quorum {
		return 0, v.granted, &NotObtainedError{Remaining: v.remaining}
	}
	return 0, v.granted, fmt.Errorf("%w: no majority of the masters answered: %w", ErrUnavailable, errors.Join(v.errs...))
}

// votes are the masters' answers to one attempt.
type votes struct {
	answers    []*reply // by master; nil while it has not answered
	granted    int
	refused    int
	fence      int64         // the largest that a granting master issued
	remaining  time.Duration // the longest lease a refusing master's holder has left
	byMajority int           // refusals that decide the attempt from a majority (ErrByMajority)
	errs       []error       // a *NodeError for each master that failed
}

// count reads replies until the attempt is decided: a majority granted it,
// or too many masters refused or failed for a majority to be possible. It
// returns early with an error when ctx ends (ErrUnavailable), with a
// master's own answer (neither contention nor failure: a stored result),
// which ends the attempt, or with one that a majority of masters gave
// (ErrByMajority).
func (rl *Redlock) count(ctx context.Context, replies <-chan reply) (votes, error) {
	v := votes{answers: make([]*reply, len(rl.nodes))}
	for range rl.nodes {
		var r reply
		select {
		case r = <-replies:
		case <-ctx.Done():
			return v, fmt.Errorf("%w: no majority of the masters answered: %w", ErrUnavailable, ctx.Err())
		}
		v.answers[r.node] = &r
		var ne *NotObtainedError
		switch {
		case r.err == nil:
			v.granted++
			v.fence = max(v.fence, r.fence)
		case errors.As(r.err, &ne):
			v.refused++
			v.remaining = max(v.remaining, ne.Remaining)
		case errors.Is(r.err, ErrByMajority):
			v.refused++
			if v.byMajority++; v.byMajority >= rl.quorum {
				return v, r.err
			}
		case errors.Is(r.err, ErrUnavailable) || ctx.Err() != nil:
			v.errs = append(v.errs, rl.nodeError(r.node, r.err))
		default: // an answer of the node's own, such as a stored result
			return v, r.err
		}
		if v.granted >= rl.quorum || len(v.errs)+v.refused > len(rl.nodes)-rl.quorum {
			break
		}
	}
	return v, nil
}

// settleGranted settles the masters of a granted attempt: those that
// answered at once, the others as they answer, since a late answer is a
// grant of this lock, or nothing to give back.
func (rl *Redlock) settleGranted(id string, at *attempt, answers []*reply, replies <-chan reply) {
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
