package engine

import (
	"context"
	"testing"
	"time"
)

// timedRefreshes is a Redis that records when each refresh is sent.
type timedRefreshes struct {
	*Redis
	sent chan time.Time
}

func (b *timedRefreshes) Refresh(ctx context.Context, key, token string, ttl time.Duration) error {
	select {
	case b.sent <- time.Now():
	default:
	}
	return b.Redis.Refresh(ctx, key, token, ttl)
}

// The default renewal interval is ttl/3: the first renewal is sent ttl/3
// after the acquire, and each next one ttl/3 after the last, so that a
// lease survives two slow or failed renewals in a row. A later first
// renewal leaves less of the lease for a reply that is slow.
func TestDefaultRenewIntervalIsThirdOfTTL(t *testing.T) {
	_, rdb := startRedis(t)
	const (
		ttl      = 1500 * time.Millisecond
		interval = ttl / 3
		late     = 200 * time.Millisecond // a late timer on a busy machine
	)
	b := &timedRefreshes{Redis: NewRedis(rdb), sent: make(chan time.Time, 8)}
	c := NewWithBackend(b, nil)
	before := time.Now()
	l := mustAcquire(t, c, testKey(t), Options{TTL: ttl})
	replied := time.Now()
	last := replied
	for i := range 3 {
		var at time.Time
		select {
		case at = <-b.sent:
		case <-time.After(ttl):
			t.Fatalf("renewal %d: none within the ttl (%v) of the last one", i, ttl)
		}
		// The first timer is armed between the acquire's send and its
		// reply, each next one after the last renewal's reply.
		earliest := before
		if i > 0 {
			earliest = last
		}
		if gap := at.Sub(earliest); gap < interval {
			t.Fatalf("renewal %d sent %v after the last, before the interval %v", i, gap, interval)
		}
		if gap := at.Sub(last); gap > interval+late {
			t.Fatalf("renewal %d sent %v after the last, want ttl/3 = %v", i, gap, interval)
		}
		last = at
	}
	if err := l.Context().Err(); err != nil {
		t.Fatalf("lock lost while renewed: %v", context.Cause(l.Context()))
	}
}
