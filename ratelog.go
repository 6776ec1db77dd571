package redislock

import (
	"sync"
	"time"

	"go.uber.org/zap"
)

// warnInterval is the least time between two warnings of one kind: a Redis
// that is down (or a wrong password) fails every request, and one line per
// request would flood the log.
const warnInterval = time.Second

// rateLimitedWarn logs at most one warning per warnInterval; the next one
// says how many were suppressed in between.
type rateLimitedWarn struct {
	mu         sync.Mutex
	next       time.Time
	suppressed int
}

// warn logs msg unless one was logged less than warnInterval ago.
func (w *rateLimitedWarn) warn(l *zap.Logger, msg string, fields ...zap.Field) {
	ok, n := w.allow()
	if !ok {
		return
	}
	if n > 0 {
		fields = append(fields, zap.Int("suppressed", n))
	}
	l.Warn(msg, fields...)
}

// allow reports whether one more may go out now, and how many were held
// back since the last one.
func (w *rateLimitedWarn) allow() (bool, int) {
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	if now.Before(w.next) {
		w.suppressed++
		return false, 0
	}
	n := w.suppressed
	w.suppressed, w.next = 0, now.Add(warnInterval)
	return true, n
}
