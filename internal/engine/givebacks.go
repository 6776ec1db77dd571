package engine

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// giveBacks are the tokens whose acquire did not answer in time, each
// waiting until a give-back of it is answered. An outage fails every
// acquire it meets, and each may still run when Redis answers again (a
// script that waited in a socket buffer or in the client's queue): a
// give-back dropped then leaves its key held for a lease by a request that
// never runs, 409 to every retry, and an earlier holder's answer refused
// until that lease ends, when a retry may run the request again. So none is
// dropped while there is room (maxQueuedGiveBacks); at most
// MaxBackground (and maxGiveBackWorkers) are tried at once, and the rest
// wait their turn, each tried again (at the back of the queue) while Redis
// does not answer.
//
// A give-back that Redis made but its replicas did not acknowledge (with
// replicas) waits in a queue of its own, tried again at most every
// unackedGiveBackPause and only when no fresh one waits: a primary with no
// replica (after a failover, until one attaches) acknowledges none, and
// each try waits out a WAIT, so that thousands of them tried in turn would
// hold back the fresh give-backs, whose begins may still take their keys.
type giveBacks struct {
	c       *Client
	mu      sync.Mutex
	queue   []giveBackItem // fresh, and tried again while Redis does not answer
	unacked []giveBackItem // made on the primary, not yet acknowledged
	running int            // workers
	trying  int            // items a worker holds
}

// giveBackItem is one token to give back, until its time is up.
type giveBackItem struct {
	b          Backend
	key, token string
	ttl        time.Duration
	until      time.Time
	notBefore  time.Time // an unacknowledged one's next try
}

// unackedGiveBackPause is how often a give-back that the replicas did not
// acknowledge is tried again.
const unackedGiveBackPause = 500 * time.Millisecond

// maxQueuedGiveBacks bounds the tokens waiting per Client (a few hundred
// bytes each): past it the oldest is dropped, and the lease ends its lock.
const maxQueuedGiveBacks = 10000

// maxGiveBackWorkers bounds the give-backs tried at once, whatever
// MaxBackground allows the other background work: while Redis refuses
// connections each worker fails fast and tries again 25ms to 100ms later
// (against a hung Redis each try waits ReleaseTimeout, and the queue goes
// round slower); once Redis answers, a few drain it in milliseconds.
const maxGiveBackWorkers = 64

// GiveBackFor is the shortest time a give-back that Redis did not answer
// is tried again for (a lease, when that is longer).
const GiveBackFor = 10 * time.Second

// The pause of a worker after a try that Redis did not answer: a paused
// Redis accepts a new connection but answers no handshake, so a give-back
// may never be written until it resumes.
const (
	minGiveBackPause = 25 * time.Millisecond
	maxGiveBackPause = 100 * time.Millisecond
)

// giveBackUntilAnswered gives token back in the background, and again
// while Redis does not answer, for at least a lease (GiveBackFor when the
// lease is shorter): it reaches Redis soon after a late acquire, and the
// mark makes a give-back repeated in any order safe. It stops when the
// Redis client is closed.
//
// It takes no context: a waiting give-back must not hold a request (and
// what its context refers to) for seconds; no value in one is needed.
func (c *Client) giveBackUntilAnswered(b Backend, key, token string, ttl time.Duration) {
	retryFor := max(ttl, GiveBackFor)
	if l, ok := b.(lasting); ok {
		retryFor = max(retryFor, l.GiveBackFor())
	}
	c.gb.add(giveBackItem{b: b, key: key, token: token, ttl: ttl, until: time.Now().Add(retryFor)})
}

// lasting is a Backend whose acquire leaves more than the lock, for longer
// than its lease unless it is given back (package record's record in
// progress, kept for its retention): its give-backs are tried again for
// GiveBackFor, when that is longer than the lock's own bound.
type lasting interface {
	GiveBackFor() time.Duration
}

// add queues it, and starts a worker while fewer than MaxBackground (and
// maxGiveBackWorkers) run.
func (q *giveBacks) add(it giveBackItem) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.push(it)
	if q.running < min(q.c.cfg.MaxBackground, maxGiveBackWorkers) {
		q.running++
		go q.work()
	}
}

// work tries the queue's tokens in turn until it is empty. After a try
// that Redis did not answer, the token goes to the back and the worker
// pauses; an answer ends the pause.
func (q *giveBacks) work() {
	var pause time.Duration
	for {
		it, ok := q.next()
		if !ok {
			return
		}
		err := q.c.giveBack(context.Background(), it.b, it.key, it.token, it.ttl)
		again := errors.Is(err, ErrUnavailable) && !errors.Is(err, redis.ErrClosed) && time.Now().Before(it.until)
		unacked := again && errors.Is(err, ErrNotReplicated)
		q.done(it, again, unacked)
		if !again || unacked {
			pause = 0
			continue
		}
		pause = min(max(2*pause, minGiveBackPause), maxGiveBackPause)
		time.Sleep(pause)
	}
}

// next takes the first token whose time is not up, a fresh one first,
// else an unacknowledged one whose pause is over; it waits for one while
// only unacknowledged ones are left, and ends the worker when none is.
func (q *giveBacks) next() (giveBackItem, bool) {
	for {
		q.mu.Lock()
		now := time.Now()
		for len(q.queue) > 0 {
			it := q.queue[0]
			q.queue[0] = giveBackItem{}
			q.queue = q.queue[1:]
			if now.Before(it.until) {
				q.trying++
				q.mu.Unlock()
				return it, true
			}
		}
		q.queue = nil
		wake := time.Time{}
		for i := 0; i < len(q.unacked); {
			it := q.unacked[i]
			switch {
			case !now.Before(it.until):
				q.unacked = slices.Delete(q.unacked, i, i+1)
				continue
			case !now.Before(it.notBefore):
				q.unacked = slices.Delete(q.unacked, i, i+1)
				q.trying++
				q.mu.Unlock()
				return it, true
			case wake.IsZero() || it.notBefore.Before(wake):
				wake = it.notBefore
			}
			i++
		}
		if wake.IsZero() {
			q.unacked = nil
			q.running--
			q.mu.Unlock()
			return giveBackItem{}, false
		}
		q.mu.Unlock()
		time.Sleep(min(time.Until(wake), minGiveBackPause))
	}
}

// done returns it to the back of its queue when it is to be tried again:
// an unacknowledged one waits unackedGiveBackPause.
func (q *giveBacks) done(it giveBackItem, again, unacked bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.trying--
	switch {
	case unacked:
		it.notBefore = time.Now().Add(unackedGiveBackPause)
		if len(q.unacked) >= maxQueuedGiveBacks {
			q.unacked = slices.Delete(q.unacked, 0, 1)
		}
		q.unacked = append(q.unacked, it)
	case again:
		q.push(it)
	}
}

// push appends it, dropping the oldest when the queue is full. The caller
// holds mu.
func (q *giveBacks) push(it giveBackItem) {
	if len(q.queue) >= maxQueuedGiveBacks {
		q.queue[0] = giveBackItem{}
		q.queue = q.queue[1:]
	}
	q.queue = append(q.queue, it)
}

// InBackground is the number of calls the Client runs in the background
// now (Background's and ReleaseAsync's) and of the tokens not yet given
// back: for a caller that must know when that work has ended (a test
// counting goroutines, say).
func (c *Client) InBackground() int { return len(c.bg) + c.gb.pending() }

// pending is the number of tokens not yet given back: waiting or being
// tried.
func (q *giveBacks) pending() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.queue) + len(q.unacked) + q.trying
}

// givingBack is a Backend that can give back a token whose acquire did not
// answer in time, so that the acquire, should it run later, takes nothing
// (Redis's GiveBack).
type givingBack interface {
	GiveBack(ctx context.Context, key, token string, ttl time.Duration) error
}

// giveBack is release for a token whose acquire may still run.
func (c *Client) giveBack(ctx context.Context, b Backend, key, token string, ttl time.Duration) error {
	return c.releaseCall(ctx, func(rctx context.Context) error { return giveBackOn(rctx, b, key, token, ttl) })
}

// giveBackOn gives token back on b: through its GiveBack when it has one,
// else its Release.
func giveBackOn(ctx context.Context, b Backend, key, token string, ttl time.Duration) error {
	if g, ok := b.(givingBack); ok {
		return g.GiveBack(ctx, key, token, ttl)
	}
	return b.Release(ctx, key, token)
}
