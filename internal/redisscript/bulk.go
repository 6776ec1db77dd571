package redisscript

import (
	"context"
	"runtime"
	"time"

	"github.com/redis/go-redis/v9"
)

// ProcessBulk is ProcessAll for commands that carry a large value (a stored
// answer): they go as one pipeline on a connection of their own, taken from
// the pool of the client that sends lone calls (the master of key's slot in
// a Cluster), not on the autopipeliner's ordered stream. There every
// command queued behind them, other requests' begins and the renewals that
// keep the leases, including the one of the lock the value completes,
// would wait for the value's transfer, seconds on a slow link. Their read
// and write deadlines are ctx's alone: the client's own timeouts, one
// fixed bound per read or write, cannot carry a value that takes longer
// than them to send. At most a quarter of the pool runs such calls at once,
// so that the lock's own calls always find a connection; the rest wait for
// their turn until ctx ends. A Conn with no client but an autopipeliner
// sends them through it (ProcessAll). On a Cluster they are tried again
// while the Cluster does not run them (retry), on the node it redirects
// them to.
func (c *Conn) ProcessBulk(ctx context.Context, key string, cmds ...redis.Cmder) error {
	return c.retry(ctx, func(r route) error {
		for _, cmd := range cmds {
			cmd.SetErr(nil)
		}
		return c.processBulk(ctx, key, r, cmds...)
	})
}

// processBulk is one try of ProcessBulk, on the node r names.
func (c *Conn) processBulk(ctx context.Context, key string, r route, cmds ...redis.Cmder) error {
	rdb, asking, err := c.bulkClient(ctx, key, r)
	if err != nil {
		return err
	}
	if rdb == nil {
		return firstErr(c.processAll(ctx, cmds, r))
	}
	done, err := c.bulkSlot(ctx)
	if err != nil {
		return err
	}
	defer done()
	return firstErr(pipeline(ctx, rdb, cmds, asking))
}

// firstErr is the first of errs that is not nil.
func firstErr(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// RunBulk is Run for a script whose arguments carry a large value: sent
// as ProcessBulk sends commands, and with its WAIT on a Conn with
// Replication.
func (c *Conn) RunBulk(ctx context.Context, s Script, keys []string, args ...any) (*redis.Cmd, error) {
	if c.repl == nil {
		return c.eval(ctx, s, keys, args, true)
	}
	var cmd *redis.Cmd
	err := c.retry(ctx, func(r route) error {
		rdb, asking, err := c.bulkClient(ctx, keys[0], r)
		if err != nil {
			return err
		}
		done, err := c.bulkSlot(ctx)
		if err != nil {
			return err
		}
		defer done()
		cmd, err = c.runReplicatedOn(ctx, rdb, asking, s, keys, args)
		return err
	})
	return cmd, err
}

// bulkClient is the client a bulk call for key goes on: the one that sends
// lone calls or a script with its WAIT, on the master of key's slot in a
// Cluster (or the node r names, with ASKING first when asking), with read
// and write timeouts of what is left of ctx. Nil when c has no client but
// an autopipeliner.
func (c *Conn) bulkClient(ctx context.Context, key string, r route) (rdb redis.UniversalClient, asking bool, err error) {
	rdb = c.bulkBase()
	if rdb == nil {
		return nil, false, nil
	}
	if _, ok := rdb.(*redis.ClusterClient); ok && c.nodes != nil {
		var node *redis.Client
		if node, asking, err = c.nodes.forKey(ctx, key, r); err != nil {
			return nil, false, err
		}
		rdb = node
	}
	if cl, ok := rdb.(*redis.Client); ok {
		if deadline, ok := ctx.Deadline(); ok {
			// A clone on the same pool, with other timeouts.
			return cl.WithTimeout(max(time.Until(deadline), time.Millisecond)), asking, nil
		}
	}
	return rdb, asking, nil
}

// bulkBase is the client under bulkClient, or nil.
func (c *Conn) bulkBase() redis.UniversalClient {
	switch {
	case c.repl != nil:
		return c.repl.Direct
	case c.direct != nil:
		return c.direct
	case c.async == nil:
		return c.rdb
	}
	return nil
}

// bulkSlot waits for one of the bulk calls' turns, at most until ctx ends,
// and returns what gives it back.
func (c *Conn) bulkSlot(ctx context.Context) (func(), error) {
	c.bulkOnce.Do(func() { c.bulk = make(chan struct{}, max(poolSize(c.bulkBase())/4, 1)) })
	select {
	case c.bulk <- struct{}{}:
		return func() { <-c.bulk }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// poolSize is the size of rdb's pool (of each node's, in a Cluster).
func poolSize(rdb redis.UniversalClient) int {
	n := 0
	switch r := rdb.(type) {
	case *redis.Client:
		n = r.Options().PoolSize
	case *redis.ClusterClient:
		n = r.Options().PoolSize
	}
	if n <= 0 {
		n = 10 * runtime.GOMAXPROCS(0) // go-redis's default
	}
	return n
}
