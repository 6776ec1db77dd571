package redislock

import (
	"sync/atomic"
	"time"
)

// maxRetryAfter bounds Retry-After while a holder renews its lease: the
// remaining lease stays near ttl for as long as the request runs, so it
// says nothing of when the request will end.
const maxRetryAfter = 5 * time.Second

// holdTimes estimates how long this handler's locks are held (a moving
// average of the holds it saw end), so that a duplicate's Retry-After says
// when its retry can succeed: a client that honours it gets the first
// request's answer about one hold later, not one lease later.
type holdTimes struct {
	avg atomic.Int64 // nanoseconds; 0 until a hold has ended
}

// observe adds a hold that ended.
func (t *holdTimes) observe(d time.Duration) {
	for {
		old := t.avg.Load()
		next := int64(max(d, 1))
		if old != 0 {
			next = old + (next-old)/8
		}
		if t.avg.CompareAndSwap(old, next) {
			return
		}
	}
}

// retryAfter is the Retry-After, in whole seconds (at least 1), for a
// duplicate of a holder whose lease has remaining left: the usual hold,
// never more than the remaining lease nor maxRetryAfter; 1 before any hold
// has ended.
func (t *holdTimes) retryAfter(remaining time.Duration) int {
	d := min(time.Duration(t.avg.Load()), remaining, maxRetryAfter)
	return max(1, int((d+time.Second-1)/time.Second))
}
