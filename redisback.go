package redislock

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisBack wakes the background tries of a client (an answer stored
// again after Redis failed) as soon as a server that failed answers again,
// instead of at their next timer: after an outage, a retry on another node
// can run a request again in the time between Redis's return and the try
// that stores its answer. A server counts as back when a command succeeds
// after a connection error, or when the pools' probe connects: rare
// events, each of which closes the current channel.
//
// It also tells new requests to let the tries land first (settle).
type redisBack struct {
	mu sync.Mutex
	ch chan struct{} // closed when a server is back
	at atomic.Int64  // when a server last came back, as sinceStart; 0: never
}

// start is what redisBack's times count from, on the monotonic clock: a
// wall clock set back would make settling sleep as long.
var start = time.Now()

// sinceStart is the time since start, never 0.
func sinceStart() int64 { return int64(time.Since(start)) + 1 }

func newRedisBack() *redisBack { return &redisBack{ch: make(chan struct{})} }

// next is what the next wait waits on: taken before a try, it is closed
// already if a server came back while the try ran.
func (b *redisBack) next() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ch
}

// waitOrBack sleeps for d, or until ch (from next) is closed; it reports
// whether ch was closed.
func waitOrBack(ch <-chan struct{}, d time.Duration) bool {
	if d <= 0 {
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-t.C:
		return false
	}
}

// back records the return (settling counts from it) and wakes every wait
// on the current channel.
func (b *redisBack) back() {
	b.markBack()
	b.wake()
}

// markBack records a server's return now.
func (b *redisBack) markBack() { b.at.Store(sinceStart()) }

// wake wakes every wait on the current channel.
func (b *redisBack) wake() {
	b.mu.Lock()
	close(b.ch)
	b.ch = make(chan struct{})
	b.mu.Unlock()
}

// settleFor is how long after a server came back a new request under an
// idempotency key waits before it may run: the answers that other requests
// got while Redis was away are stored in that time (their tries are woken,
// and 25ms apart), so that a retry finds its answer instead of running
// again. Several tries' worth, as the nodes see Redis return at slightly
// different moments.
const settleFor = 8 * redialInterval

// lastBack is when a server last came back (sinceStart, 0: never): a begin
// compares it before and after itself to tell whether it saw Redis return.
func (b *redisBack) lastBack() int64 { return b.at.Load() }

// settling is how much of settleFor is left since the return at at (from
// lastBack; 0: none).
func settling(at int64) time.Duration {
	if at == 0 {
		return 0
	}
	return min(settleFor, settleFor-time.Duration(sinceStart()-at))
}

// settle sleeps until settleFor has passed since the return at at; it
// reports whether it slept.
func settle(at int64) bool {
	d := settling(at)
	if d > 0 {
		time.Sleep(d)
	}
	return d > 0
}

// serverHealth follows one server's command results: a success after a
// connection error means it is back.
type serverHealth struct {
	failing atomic.Bool
	b       *redisBack
}

// report takes one command's or dial's result. Redis's own error replies
// are answers, but for those of a server not ready to serve (loading its
// data, running a long script, a cluster or replica not in order);
// a caller's cancellation and a full local pool tell nothing; anything
// else is a failure to reach it (a failure that was not one would make new
// requests settle).
func (s *serverHealth) report(err error) {
	var reply redis.Error
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, redis.ErrPoolTimeout):
	case err == nil || errors.As(err, &reply) && !notReady(err):
		if s.failing.Load() {
			// The time first: a command that succeeds beside this one,
			// once failing is cleared, must find it moved.
			s.b.markBack()
			if s.failing.Swap(false) {
				s.b.wake()
			}
		}
	case !s.failing.Load():
		s.failing.Store(true)
	}
}

// notReady reports whether err is the reply of a server that is up but
// cannot serve yet.
func notReady(err error) bool {
	for _, p := range notReadyPrefixes {
		if redis.HasErrorPrefix(err, p) {
			return true
		}
	}
	return false
}

// "BUSY " with its space: not BUSYKEY or BUSYGROUP, which are answers.
var notReadyPrefixes = []string{"LOADING", "BUSY ", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "READONLY"}
