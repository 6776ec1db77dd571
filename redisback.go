package redislock

import (
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
type redisBack struct {
	mu sync.Mutex
	ch chan struct{} // closed when a server is back
}

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

// back wakes every wait on the current channel.
func (b *redisBack) back() {
	b.mu.Lock()
	close(b.ch)
	b.ch = make(chan struct{})
	b.mu.Unlock()
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
// anything else is a failure to reach it.
func (s *serverHealth) report(err error) {
	var reply redis.Error
	switch {
	case err == nil || errors.As(err, &reply) && !notReady(err):
		if s.failing.Load() && s.failing.Swap(false) {
			s.b.back()
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
