package engine

import (
	"testing"
	"time"
)

// After a keep-alive renewal the local deadline is sent + ttl - margin,
// like after a manual Refresh: without the margin a holder would count on
// a lease that Redis may already have ended.
func TestKeepAliveDeadlineKeepsMargin(t *testing.T) {
	_, rdb := startRedis(t)
	renewed := make(chan time.Time, 16)
	c := New(rdb, &Config{OnRenew: func(err error) {
		if err == nil {
			renewed <- time.Now() // after the refresh was sent, before the deadline moves
		}
	}})
	const ttl = time.Second
	l := mustAcquire(t, c, testKey(t), Options{TTL: ttl})
	defer l.Release(ctxT(t))
	first := l.Deadline()
	for i := range 2 {
		var at time.Time
		select {
		case at = <-renewed:
		case <-time.After(5 * time.Second):
			t.Fatal("no renewal within 5s")
		}
		time.Sleep(50 * time.Millisecond) // the deadline moves right after OnRenew; the next renewal is ttl/3 away
		d := l.Deadline()
		if limit := at.Add(ttl - leaseMargin(ttl)); d.After(limit) {
			t.Fatalf("renewal %d: deadline %v is past sent + ttl - margin (at most %v)", i, d, limit)
		}
		if !d.After(first) {
			t.Fatalf("renewal %d: deadline %v did not move from %v", i, d, first)
		}
	}
}
