package engine

import (
	"context"
	"time"
)

// releaseWatcher is a Backend whose releases wake the requests waiting for
// them (Redis, Redlock, and package record's begin): a waiter subscribes,
// then its attempts mark the lock as waited for (Waiting), and the holder's
// release publishes only when that mark is there.
type releaseWatcher interface {
	// WatchRelease subscribes to key's releases: the channel receives
	// after each one; stop ends the subscription.
	WatchRelease(ctx context.Context, key string) (released <-chan struct{}, stop func(), err error)
}

type waitingKey struct{}

// Waiting reports whether an acquire attempt on ctx comes from a request
// that waits for the lock and listens for its release: a Backend's
// refusal then marks the lock as waited for, so that its release wakes
// the waiter.
func Waiting(ctx context.Context) bool {
	w, _ := ctx.Value(waitingKey{}).(bool)
	return w
}

func withWaiting(ctx context.Context) context.Context {
	return context.WithValue(ctx, waitingKey{}, true)
}

// WatchRelease subscribes to the releases of key on this Redis.
func (r *Redis) WatchRelease(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	return r.conn.WatchRelease(ctx, key)
}

// WatchRelease subscribes to the releases of key on every master: a
// release on any of them wakes the waiter. It fails only when no master
// took the subscription.
func (rl *Redlock) WatchRelease(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	type sub struct {
		ch   <-chan struct{}
		stop func()
		err  error
	}
	subs := make(chan sub, len(rl.nodes))
	for _, n := range rl.nodes {
		go func() {
			w, ok := n.(releaseWatcher)
			if !ok {
				subs <- sub{err: ErrUnavailable}
				return
			}
			ch, stop, err := w.WatchRelease(ctx, key)
			subs <- sub{ch, stop, err}
		}()
	}
	woken := make(chan struct{}, 1)
	done := make(chan struct{})
	var stops []func()
	var last error
	for range rl.nodes {
		s := <-subs
		if s.err != nil {
			last = s.err
			continue
		}
		stops = append(stops, s.stop)
		go func() {
			for {
				select {
				case <-s.ch:
					select {
					case woken <- struct{}{}:
					default:
					}
				case <-done:
					return
				}
			}
		}()
	}
	if len(stops) == 0 {
		return nil, nil, last
	}
	return woken, func() {
		close(done)
		for _, s := range stops {
			s()
		}
	}, nil
}

// watch subscribes to the releases of key on b, when b can, bounded by a
// call's timeout; nil when it cannot (the waiter polls).
func (c *Client) watch(ctx context.Context, b Backend, key string) (<-chan struct{}, func()) {
	w, ok := b.(releaseWatcher)
	if !ok {
		return nil, nil
	}
	wctx, cancel := c.callContext(ctx)
	defer cancel()
	ch, stop, err := w.WatchRelease(wctx, key)
	if err != nil {
		return nil, nil
	}
	return ch, stop
}

// sleepOrWake waits d, or until woken receives or ctx ends.
func sleepOrWake(ctx context.Context, d time.Duration, woken <-chan struct{}) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
	case <-woken:
	}
	return nil
}
