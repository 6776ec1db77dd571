package redisconn

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// serverHealth follows one server's command results: a success after a
// failure to reach it is the server's recovery.
type serverHealth struct {
	failing  atomic.Bool
	recovery *Recovery
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
			// The moment first: a command that succeeds beside this one,
			// once failing is cleared, must find it moved.
			s.recovery.mark()
			if s.failing.Swap(false) {
				s.recovery.wake()
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
