package engine

import (
	"context"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/caddy-redis-lock/internal/redisscript"
)

// Redis is the Backend of one Redis deployment, through any go-redis client:
// a standalone server, a Sentinel-managed primary, a Cluster. The lock is a
// hash whose one field is the holder's token (its value the fencing token),
// so that release is the native HDEL; acquire and refresh are Lua scripts.
type Redis struct {
	conn *redisscript.Conn
}

// NewRedis returns the Backend of rdb. For context deadlines to bound each
// call, create rdb with ContextTimeoutEnabled. A deferred autopipeliner
// (AsyncAutoPipeline) shares round trips between concurrent callers, and
// each call still gives up waiting at its deadline.
func NewRedis(rdb redis.UniversalClient) *Redis {
	return &Redis{conn: redisscript.NewConn(rdb)}
}

// Replication is what NewReplicatedRedis waits for.
type Replication struct {
	// Replicas is how many replicas must acknowledge a lock, a renewal
	// (and, in package record, an answer) before it counts: Redis WAIT.
	Replicas int
	// Timeout bounds each script and its wait: the WAIT gives up at half
	// of it (or of what is left of the call's context), leaving the rest
	// for its reply. Set it to the client's read timeout.
	Timeout time.Duration
	// Direct sends each script with its WAIT, in one pipeline on one
	// connection: a *redis.Client, a failover client or a
	// *redis.ClusterClient, not an autopipeliner (which may split them
	// over two connections, and WAIT counts its own connection's writes).
	// Default: rdb.
	Direct redis.UniversalClient
}

// NewReplicatedRedis is NewRedis whose acquires and refreshes count only
// once repl.Replicas replicas have acknowledged them, so that a failover
// that promotes one of those replicas keeps the lock. One that is not
// acknowledged in time fails with an error that matches ErrUnavailable and
// ErrNotReplicated (an acquire's lock is then given back, as after any
// acquire whose outcome is unknown).
func NewReplicatedRedis(rdb redis.UniversalClient, repl Replication) *Redis {
	return &Redis{conn: redisscript.NewReplicatedConn(rdb, redisscript.Replication(repl))}
}

// NewPipelinedRedis is NewReplicatedRedis of ap, a deferred autopipeliner
// (AsyncAutoPipeline) of the client direct, for the least latency at any
// load: a call made while no other is in flight goes on direct as its own
// round trip, without ap's two goroutine hand-offs; concurrent calls share
// ap's round trips. repl.Direct defaults to direct.
func NewPipelinedRedis(ap, direct redis.UniversalClient, repl Replication) *Redis {
	return &Redis{conn: redisscript.NewPipelinedConn(ap, direct, redisscript.Replication(repl))}
}

// Conn is what r runs its commands and scripts on: package record runs its
// own there, beside the locks.
func (r *Redis) Conn() *redisscript.Conn { return r.conn }

// Node is r itself: the Redis a master's locks live on (Master).
func (r *Redis) Node() *Redis { return r }

// Masters is r alone, named "redis", a majority of one.
func (r *Redis) Masters() Masters {
	return Masters{Nodes: []*Redis{r}, Names: []string{"redis"}, Quorum: 1}
}

// TryAcquire runs the acquire script: the lock and its fencing token, or the
// holder's remaining lease. It carries its deadline on the server's clock:
// run after it, it takes nothing (ErrUnavailable).
func (r *Redis) TryAcquire(ctx context.Context, key, token string, ttl time.Duration) (int64, error) {
	var cmd *redis.Cmd
	var err error
	keys := []string{key, CounterKey(key), GoneKey(key, token)}
	deadline := r.conn.Deadline(ctx)
	if Waiting(ctx) {
		cmd, err = r.conn.Run(ctx, acquireScript, keys, token, ttl.Milliseconds(), deadline, "1")
	} else {
		cmd, err = r.conn.Run(ctx, acquireScript, keys, token, ttl.Milliseconds(), deadline)
	}
	return r.conn.Grant(ctx, cmd, err, notObtained)
}

// notObtained is the error of a lock another holder has for remaining.
func notObtained(remaining time.Duration) error { return &NotObtainedError{Remaining: remaining} }

// Refresh extends key's lease to ttl if it still holds token.
func (r *Redis) Refresh(ctx context.Context, key, token string, ttl time.Duration) error {
	cmd, err := r.conn.Run(ctx, refreshScript, []string{key}, token, ttl.Milliseconds())
	if err != nil && !redisscript.Unreplicated(err) {
		return redisscript.Classify(ctx, err)
	}
	n, cerr := cmd.Int64()
	if cerr != nil {
		return redisscript.Classify(ctx, cerr)
	}
	if n != 1 {
		return ErrNotHeld
	}
	// A renewal the replicas did not acknowledge does not extend the
	// lease: a failover would bring back the old one.
	return redisscript.Classify(ctx, err)
}

// Release deletes key if it still holds token: HDEL deletes only our own
// field, and Redis deletes the key with its last field. No script, so no
// script cache to miss either.
func (r *Redis) Release(ctx context.Context, key, token string) error {
	released, err := r.conn.ReleaseFields(ctx, key, token)
	if err == nil && !released {
		return ErrNotHeld
	}
	return err
}

// GiveBack is Release for a token whose acquire did not answer in time: it
// also marks token given back on key (GoneKey) for ttl, so that the acquire,
// should it run after this (it waited in a socket buffer while this went on
// another connection), takes nothing. It returns ErrNotHeld when there was
// nothing to delete.
func (r *Redis) GiveBack(ctx context.Context, key, token string, ttl time.Duration) error {
	released, err := r.conn.GiveBackFields(ctx, key, GoneKey(key, token), ttl, token)
	if err == nil && !released {
		return ErrNotHeld
	}
	return err
}

// RaiseFence sets the fencing counter of key to fence unless it is already
// at or above it: Redlock writes the winning token back to a majority, so
// that every later majority issues larger ones.
func (r *Redis) RaiseFence(ctx context.Context, key string, fence int64) error {
	if _, err := r.conn.Run(ctx, raiseScript, []string{CounterKey(key)}, strconv.FormatInt(fence, 10)); err != nil {
		return redisscript.Classify(ctx, err)
	}
	return nil
}

var _ Placed = (*Redis)(nil)
