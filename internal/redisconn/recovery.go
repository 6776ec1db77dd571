package redisconn

import (
	"sync"
	"sync/atomic"
	"time"
)

// Recovery is Redis's return after an outage, as a Conn sees it: a server
// recovers when a command succeeds on it after a failure to reach it
// (serverHealth), or when a pool's probe connects to it (redialer). Both
// are rare events.
//
// It wakes the work that waits for Redis (an answer stored again after
// Redis failed: Watch) as soon as Redis recovers, instead of at its next
// timer: after an outage, a retry on another node can run a request again
// in the time between Redis's return and the try that stores its answer.
// And it tells new requests to let those tries land first (Last, Settle).
type Recovery struct {
	mu sync.Mutex
	ch chan struct{} // closed at the next recovery
	at atomic.Int64  // the Moment of the last recovery
}

func newRecovery() *Recovery { return &Recovery{ch: make(chan struct{})} }

// Moment is when a recovery happened: the time since the process started,
// on the monotonic clock (a wall clock set back would make settling sleep
// as long), never 0. The zero Moment is none.
type Moment int64

// start is what Moments count from.
var start = time.Now()

// now is the Moment now.
func now() Moment { return Moment(time.Since(start)) + 1 }

// Last is the Moment of the last recovery, 0 if none: a begin compares it
// before and after itself to tell whether it saw Redis recover.
func (r *Recovery) Last() Moment { return Moment(r.at.Load()) }

// recovered records a recovery now (settling counts from it) and wakes
// every Watch.
func (r *Recovery) recovered() {
	r.mark()
	r.wake()
}

// mark records a recovery now.
func (r *Recovery) mark() { r.at.Store(int64(now())) }

// wake wakes every Watch waiting on the current channel.
func (r *Recovery) wake() {
	r.mu.Lock()
	close(r.ch)
	r.ch = make(chan struct{})
	r.mu.Unlock()
}

// next is the channel the next recovery closes.
func (r *Recovery) next() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ch
}

// Watch follows recoveries from now on: one that comes while a try runs
// ends the wait after it at once.
func (r *Recovery) Watch() *Watch { return &Watch{r: r, ch: r.next()} }

// A Watch waits for Redis's recovery.
type Watch struct {
	r  *Recovery
	ch <-chan struct{}
}

// Recovered is closed at the first recovery since the watch began or last
// waited.
func (w *Watch) Recovered() <-chan struct{} { return w.ch }

// Wait sleeps for d, or until a recovery since the watch began or last
// waited (at once if one came meanwhile); it reports whether a recovery
// ended it. The watch then follows recoveries from now on.
func (w *Watch) Wait(d time.Duration) bool {
	woken := wait(w.ch, d)
	w.ch = w.r.next()
	return woken
}

// wait sleeps for d, or until ch is closed; it reports whether ch was.
func wait(ch <-chan struct{}, d time.Duration) bool {
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

// SettleFor is how long after a recovery a new request under an
// idempotency key waits before it may run: the answers that other requests
// got while Redis was away are stored in that time (their tries are woken,
// and RedialInterval apart), so that a retry finds its answer instead of
// running again. Several tries' worth, as the nodes see Redis recover at
// slightly different moments.
const SettleFor = 8 * RedialInterval

// settling is how much of SettleFor is left since the recovery at at (0:
// none).
func settling(at Moment) time.Duration {
	if at == 0 {
		return 0
	}
	return min(SettleFor, SettleFor-time.Duration(now()-at))
}

// Settle sleeps until SettleFor has passed since the recovery at at (from
// Last); it reports whether it slept.
func Settle(at Moment) bool {
	d := settling(at)
	if d > 0 {
		time.Sleep(d)
	}
	return d > 0
}
