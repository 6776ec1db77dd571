package redisscript

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrNotReplicated is the lock engine's ErrNotReplicated: a write that fewer
// replicas than asked acknowledged in time (Redis WAIT). The write itself
// was made on the primary.
var ErrNotReplicated = errors.New("redislock: write not acknowledged by enough replicas")

// ReplicationError is a write that Acked of Want replicas acknowledged
// within the wait. It matches ErrNotReplicated.
type ReplicationError struct{ Acked, Want int64 }

func (e *ReplicationError) Error() string {
	return fmt.Sprintf("%v: %d of %d", ErrNotReplicated, e.Acked, e.Want)
}

// Is makes errors.Is(err, ErrNotReplicated) true.
func (e *ReplicationError) Is(target error) bool { return target == ErrNotReplicated }

// Replication makes a Conn's scripts wait until replicas acknowledge what
// they wrote, so that a failover that promotes one of them keeps it.
type Replication struct {
	// Replicas is how many replicas must acknowledge each script's writes.
	Replicas int
	// Timeout bounds each wait for them.
	Timeout time.Duration
	// Direct is the client a script and its WAIT are sent on, as one
	// pipeline on one connection: WAIT counts the acknowledgements of its
	// own connection's writes, and an autopipeliner may send the two on
	// different ones. A *redis.Client (standalone, Sentinel) or a
	// *redis.ClusterClient, whose key's master gets the pipeline (WAIT has
	// no key for the cluster client to route it by).
	Direct redis.UniversalClient
}

// NewReplicatedConn returns the Conn of rdb whose scripts wait for
// repl.Replicas replicas (none when it is 0: NewConn).
func NewReplicatedConn(rdb redis.UniversalClient, repl Replication) *Conn {
	c := NewConn(rdb)
	if repl.Replicas > 0 {
		if repl.Direct == nil {
			repl.Direct = rdb
		}
		c.repl = &repl
		c.setCluster(clusterOf(repl.Direct))
	}
	return c
}

// runReplicated runs s, then WAIT, in one pipeline on one connection to
// the master of keys[0]. Its error is the script's, else a
// *ReplicationError when fewer than Replicas acknowledged in time. On a
// Cluster it is tried again (retry) while the Cluster does not run it, on
// the node it redirects it to, or while the replicas do not acknowledge it
// (a new master's replicas still connecting after a failover): the script
// is idempotent for its token, and its WAIT counts the acknowledgements of
// all the connection's writes so far.
func (c *Conn) runReplicated(ctx context.Context, s Script, keys []string, args []any) (*redis.Cmd, error) {
	var cmd *redis.Cmd
	err := c.retry(ctx, func(r route) error {
		p, asking, err := c.directFor(ctx, keys[0], r)
		if err != nil {
			return err
		}
		cmd, err = c.runReplicatedOn(ctx, p, asking, s, keys, args)
		return err
	})
	return cmd, err
}

// runReplicatedOn is one try of runReplicated on p, a client of the master
// of keys[0], or of the node that imports its slot with ASKING first when
// asking.
func (c *Conn) runReplicatedOn(ctx context.Context, p redis.Cmdable, asking bool, s Script, keys []string, args []any) (*redis.Cmd, error) {
	waitUntil := c.waitDeadline(ctx)
	cmd, acked, err := c.pipelineWait(ctx, p, asking, waitUntil, evalArgs("evalsha", s.sha, keys, args))
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		// The first WAIT waited too, for the connection's earlier writes:
		// the two share one budget.
		cmd, acked, err = c.pipelineWait(ctx, p, asking, waitUntil, evalArgs("eval", s.src, keys, args))
	}
	if err != nil {
		return cmd, err
	}
	if want := int64(c.repl.Replicas); acked < want {
		return cmd, &ReplicationError{Acked: acked, Want: want}
	}
	return cmd, nil
}

// pipelineWait sends the script of args and WAIT, until waitUntil, in one
// pipeline on p, after ASKING when asking.
func (c *Conn) pipelineWait(ctx context.Context, p redis.Cmdable, asking bool, waitUntil time.Time, args []any) (*redis.Cmd, int64, error) {
	cmd := redis.NewCmd(ctx, args...)
	wait := redis.NewIntCmd(ctx, "wait", c.repl.Replicas, max(time.Until(waitUntil).Milliseconds(), 1))
	_, err := p.Pipelined(ctx, func(pl redis.Pipeliner) error {
		if asking {
			_ = pl.Process(ctx, redis.NewStatusCmd(ctx, "asking"))
		}
		_ = pl.Process(ctx, cmd)
		_ = pl.Process(ctx, wait)
		return nil
	})
	if err := cmd.Err(); err != nil {
		return cmd, 0, err
	}
	if err != nil {
		return cmd, 0, err
	}
	return cmd, wait.Val(), nil
}

// waitDeadline is when the WAITs of one script give up: half of Timeout
// from now, and half of what is left of ctx. The other half is for the
// reply to come back before the connection's read deadline (the client's
// read timeout, Timeout, or ctx's deadline): Redis ends a WAIT on its own
// timer, which can run late by up to a tick of its event loop (100ms at
// the default hz 10).
func (c *Conn) waitDeadline(ctx context.Context) time.Time {
	d := c.repl.Timeout
	if deadline, ok := ctx.Deadline(); ok {
		d = min(d, time.Until(deadline))
	}
	return time.Now().Add(d / 2)
}

// directFor is the client that sends key's script and its WAIT, after r,
// and whether it must send ASKING first.
func (c *Conn) directFor(ctx context.Context, key string, r route) (redis.Cmdable, bool, error) {
	if _, ok := c.repl.Direct.(*redis.ClusterClient); ok && c.nodes != nil {
		return c.nodes.forKey(ctx, key, r)
	}
	return c.repl.Direct, false, nil
}

// Replicas is how many replicas each script's writes wait for.
func (c *Conn) Replicas() int {
	if c.repl == nil {
		return 0
	}
	return c.repl.Replicas
}

// Unreplicated reports whether err is only a write's missing
// acknowledgements (the write itself was made).
func Unreplicated(err error) bool { return errors.Is(err, ErrNotReplicated) }

// Grant reads the reply of a lock script run by Run, whose error was err,
// as ParseGrant does. A grant whose writes the replicas did not
// acknowledge is an ErrUnavailable error (a failover may lose the lock);
// a refusal, which wrote nothing, is one whatever the replicas say.
func Grant(ctx context.Context, cmd *redis.Cmd, err error, notObtained func(time.Duration) error) (int64, error) {
	if err != nil && !Unreplicated(err) {
		return 0, Classify(ctx, err)
	}
	fence, perr := ParseGrant(ctx, cmd.Val(), notObtained)
	if perr != nil {
		return 0, perr
	}
	if err != nil {
		return 0, Classify(ctx, err)
	}
	return fence, nil
}
