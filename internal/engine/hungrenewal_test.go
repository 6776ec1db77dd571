package engine

import (
	"context"
	"errors"
	"testing"
	"time"
)

// hungBackend grants every lock and hangs every refresh for hang, whatever
// its context says: a Redis connection that stops answering under a
// client that does not honour context deadlines, or a script stuck on the
// server. Release returns at once.
type hungBackend struct {
	hang     time.Duration
	released chan struct{} // closed when the test ends: hung refreshes return
}

func (b *hungBackend) TryAcquire(context.Context, string, string, time.Duration) (int64, error) {
	return 1, nil
}

func (b *hungBackend) Refresh(context.Context, string, string, time.Duration) error {
	select {
	case <-time.After(b.hang):
	case <-b.released:
	}
	return nil
}

func (b *hungBackend) Release(context.Context, string, string) error { return nil }

// A renewal that hangs, ignoring its context, does not keep the lock: its
// Context ends with ErrLeaseExpired at the local lease deadline, while the
// refresh is still in flight, not when the refresh returns. Past that
// deadline Redis may have given the key to another holder.
func TestHungRenewalEndsAtDeadline(t *testing.T) {
	const (
		ttl  = 300 * time.Millisecond // first renewal at ttl/3, deadline at ttl - margin
		hang = 2 * time.Second        // far past the deadline
		late = 200 * time.Millisecond // a late timer on a busy machine
	)
	b := &hungBackend{hang: hang, released: make(chan struct{})}
	c := NewWithBackend(b, nil)
	l, err := c.Acquire(ctxT(t), testKey(t), Options{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Release(context.Background()) })
	t.Cleanup(func() { close(b.released) }) // first: Release waits for the hung refresh
	d := l.Deadline()
	if !waitDone(t, l.Context(), time.Until(d)+hang+time.Second) {
		t.Fatalf("lock still live %v past its deadline", hang+time.Second)
	}
	ended := time.Now()
	if cause := context.Cause(l.Context()); !errors.Is(cause, ErrLeaseExpired) {
		t.Fatalf("cause = %v, want ErrLeaseExpired", cause)
	}
	if ended.Before(d.Add(-time.Millisecond)) {
		t.Fatalf("context ended %v before the deadline", d.Sub(ended))
	}
	if ended.After(d.Add(late)) {
		t.Fatalf("context ended %v after the deadline, want at the deadline (the hung refresh returns %v after it was sent)", ended.Sub(d), hang)
	}
	t.Logf("context ended %v after the deadline", ended.Sub(d))
}
