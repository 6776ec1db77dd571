package redisscript

import (
	"context"
	"errors"
)

// maxWatches bounds the subscriptions of one Conn's waiters, each a
// connection of its own: beyond it, waiters poll.
const maxWatches = 256

// errTooManyWatches is WatchRelease's error beyond maxWatches.
var errTooManyWatches = errors.New("redislock: too many requests waiting for a release at once; polling")

// WatchRelease subscribes to the releases of the lock key (SSUBSCRIBE to
// its sharded channel, named as the key: in a Cluster, on the node of its
// slot). It returns once Redis confirmed the subscription, so that a
// release published from then on is not missed, a channel that receives
// after each release (a missed one is not queued twice), and stop, which
// ends the subscription. A subscription that breaks is made again by
// go-redis; what was published meanwhile is lost, which a waiter's polling
// covers.
func (c *Conn) WatchRelease(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	select {
	case c.watches <- struct{}{}:
	default:
		return nil, nil, errTooManyWatches
	}
	ps := c.rdb.SSubscribe(ctx, key)
	if _, err := ps.Receive(ctx); err != nil {
		_ = ps.Close()
		<-c.watches
		return nil, nil, Classify(ctx, err)
	}
	woken := make(chan struct{}, 1)
	done := make(chan struct{})
	msgs := ps.Channel()
	go func() {
		for {
			select {
			case _, ok := <-msgs:
				if !ok {
					return
				}
				select {
				case woken <- struct{}{}:
				default:
				}
			case <-done:
				return
			}
		}
	}()
	stop := func() {
		close(done)
		_ = ps.Close()
		<-c.watches
	}
	return woken, stop, nil
}
