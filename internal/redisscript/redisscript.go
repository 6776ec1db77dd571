// Package redisscript is the plumbing that the lock engine
// (internal/engine) and package record share to run their commands and Lua
// scripts on one Redis deployment: the scripts' shared Lua (TakeLua),
// EVALSHA with its EVAL fallback, pipelines through go-redis's deferred
// autopipeliner, and the reading of a lock script's reply. It is no part of
// either package's API.
package redisscript

import (
	"cmp"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// TakeLua is the Lua that takes a lock and issues its fencing token, for the
// scripts that take one in the same round trip as their own work (engine's
// acquire.lua, record's begin.lua): prefix their source with it and call
// acquire(lock_key, token, lease_ms, counter_key, gone_key, deadline[,
// field, value]), which takes the lock when it is free, or renews it when
// token holds it already (a retried acquire), and returns the fencing token,
// an error reply ('LATE <now>' when it runs after deadline: Conn.Deadline),
// or nil when another holder has the lock.
//
//go:embed take.lua
var TakeLua string

// Script is a Lua script and its SHA1, the name EVALSHA knows it by.
type Script struct {
	Src, SHA string
	// src and sha are Src and SHA as command arguments, boxed once: a
	// string put in an interface is a heap allocation, on every call.
	src, sha any
}

// New returns the Script of src.
func New(src string) Script {
	sha := redis.NewScript(src).Hash()
	return Script{Src: src, SHA: sha, src: src, sha: sha}
}

// ErrUnavailable is the lock engine's ErrUnavailable (engine and lock
// re-export it): Redis could not be reached or did not answer in time. It
// is defined here so that Classify, which engine and record use, can wrap
// it.
var ErrUnavailable = errors.New("redislock: redis unavailable")

// Classify turns a Redis call error into the lock's errors: the caller's
// own cancellation stays a context error, anything else is ErrUnavailable.
// A call retried until its deadline (*RetryError) stays one within either,
// so that the log says what the Cluster answered meanwhile.
func Classify(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		var re *RetryError
		if errors.As(err, &re) {
			return fmt.Errorf("%w: %w", ctxErr, re)
		}
		return ctxErr
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		// An internal deadline (release timeout, lease deadline), not the
		// caller's: do not let it match the caller's context errors.
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// ParseGrant reads the reply of a script that takes a lock as acquire.lua
// does: the fencing token as a decimal string when the lock is ours, the
// holder's PTTL as an integer when it is not, which it returns as
// notObtained's error (the engine's *NotObtainedError).
func ParseGrant(ctx context.Context, reply any, notObtained func(remaining time.Duration) error) (int64, error) {
	switch v := reply.(type) {
	case string:
		if fence, err := strconv.ParseInt(v, 10, 64); err == nil {
			return fence, nil
		}
	case int64: // negative: no TTL, or just gone
		return 0, notObtained(max(time.Duration(v), 0) * time.Millisecond)
	}
	return 0, Classify(ctx, fmt.Errorf("unexpected reply from a lock script: %T %v", reply, reply))
}

// Conn runs commands and scripts on one Redis deployment, through any
// go-redis client.
type Conn struct {
	rdb     redis.UniversalClient
	async   submitter             // rdb as a deferred autopipeliner, else nil
	direct  redis.UniversalClient // sends lone calls beside async, else nil
	busy    atomic.Int64          // calls in flight, when direct is set
	repl    *Replication          // scripts wait for replicas, else nil
	watches chan struct{}         // WatchRelease's subscriptions open
	clock   clock                 // the server's clock, for acquires' deadlines

	cluster  *redis.ClusterClient // a Cluster's client: calls are retried (retry), else nil
	nodes    *clusterNodes        // its nodes' clients, for a redirect
	observer RetryObserver        // told of the retries, or nil

	bulkOnce sync.Once
	bulk     chan struct{} // the bulk calls running (ProcessBulk)
}

// NewConn returns the Conn of rdb. A deferred autopipeliner
// (AsyncAutoPipeline) shares round trips between concurrent callers, and
// each call still gives up waiting at its deadline.
func NewConn(rdb redis.UniversalClient) *Conn {
	c := &Conn{rdb: rdb, watches: make(chan struct{}, maxWatches), clock: clock{base: time.Now()}}
	if s, ok := rdb.(submitter); ok && !s.IsBlocking() {
		c.async = s
	}
	c.setCluster(clusterOf(rdb))
	return c
}

// NewPipelinedConn is NewReplicatedConn of ap, a deferred autopipeliner of
// the client direct, which also sends a call made while no other is in
// flight. Such a lone call has nobody to share a round trip with, and
// through ap it would pay two goroutine hand-offs (to ap's flusher, back
// to the caller): about 40µs a command on the 2-core machine, a third of
// a lock's cost at low load (bench/README.md). Under concurrency calls
// overlap and go through ap, whose shared round trips cost Redis a
// quarter of the CPU. Direct calls keep the bounds ap's have: direct's
// reads give up at the call's deadline (ContextTimeoutEnabled), and a
// command that may still run late is one the give-back already expects
// (GiveBackFields).
func NewPipelinedConn(ap, direct redis.UniversalClient, repl Replication) *Conn {
	if repl.Direct == nil {
		repl.Direct = direct
	}
	c := NewReplicatedConn(ap, repl)
	if c.async != nil {
		c.direct = direct
	}
	c.setCluster(clusterOf(direct))
	return c
}

// Client is the go-redis client of c.
func (c *Conn) Client() redis.UniversalClient { return c.rdb }

// Deferred reports whether c sends through a deferred autopipeliner.
func (c *Conn) Deferred() bool { return c.async != nil }

// submitter is go-redis's deferred autopipeliner (AsyncAutoPipeline). A
// command queued there is sent when its batch's turn comes whatever its
// context says, so a call waits on its future and gives up at its own
// deadline; the blocking face would wait for the batch however long it
// takes.
type submitter interface {
	Submit(ctx context.Context, cmd redis.Cmder) redis.AutoFuture
	IsBlocking() bool
}

// Process runs cmd and waits for its reply at most until ctx ends, trying
// again on a Cluster (retry). After a context error cmd must not be read:
// its batch may still complete it.
func (c *Conn) Process(ctx context.Context, cmd redis.Cmder) error {
	return c.retry(ctx, func(r route) error {
		cmd.SetErr(nil)
		return c.process(ctx, cmd, r)
	})
}

// process is one try of Process, on the node r names, if any.
func (c *Conn) process(ctx context.Context, cmd redis.Cmder, r route) error {
	if n, asking := c.redirected(ctx, r); n != nil {
		if asking {
			return firstErr(pipeline(ctx, n, []redis.Cmder{cmd}, true))
		}
		return n.Process(ctx, cmd)
	}
	if c.async == nil {
		return c.rdb.Process(ctx, cmd)
	}
	if c.direct != nil {
		defer c.busy.Add(-1)
		if c.busy.Add(1) == 1 {
			return c.direct.Process(ctx, cmd)
		}
	}
	return c.async.Submit(ctx, cmd).WaitContext(ctx)
}

// ProcessAll runs cmds in order and waits for all of them, at most until
// ctx ends. Through a deferred autopipeliner they are queued one after the
// other on its ordered stream, where they share batches (a round trip each
// batch) with other callers' commands, as the lock's own commands do; on
// another client, or alone on a Conn's direct client, they are one
// pipeline. The error is the first command's that failed. On a Cluster the
// commands that failed are tried again (retry), those that succeeded are
// not.
func (c *Conn) ProcessAll(ctx context.Context, cmds ...redis.Cmder) error {
	todo := cmds
	return c.retry(ctx, func(r route) error {
		for _, cmd := range todo {
			cmd.SetErr(nil)
		}
		var first error
		var failed []redis.Cmder
		for i, err := range c.processAll(ctx, todo, r) {
			if err != nil {
				first = cmp.Or(first, err)
				failed = append(failed, todo[i])
			}
		}
		todo = failed
		return first
	})
}

// processAll is one try of ProcessAll, on the node r names, if any: each
// command's error.
func (c *Conn) processAll(ctx context.Context, cmds []redis.Cmder, r route) []error {
	if n, asking := c.redirected(ctx, r); n != nil {
		return pipeline(ctx, n, cmds, asking)
	}
	if c.async == nil {
		return pipeline(ctx, c.rdb, cmds, false)
	}
	if c.direct != nil {
		defer c.busy.Add(-1)
		if c.busy.Add(1) == 1 {
			return pipeline(ctx, c.direct, cmds, false)
		}
	}
	futures := make([]redis.AutoFuture, len(cmds))
	for i, cmd := range cmds {
		futures[i] = c.async.Submit(ctx, cmd)
	}
	errs := make([]error, len(cmds))
	for i, f := range futures {
		errs[i] = f.WaitContext(ctx)
	}
	return errs
}

// pipeline sends cmds in one pipeline on rdb, each after ASKING when
// asking (a Cluster node that imports their slot), and returns each one's
// error.
func pipeline(ctx context.Context, rdb redis.Cmdable, cmds []redis.Cmder, asking bool) []error {
	_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, cmd := range cmds {
			if asking {
				_ = p.Process(ctx, redis.NewStatusCmd(ctx, "asking"))
			}
			_ = p.Process(ctx, cmd)
		}
		return nil
	})
	errs := make([]error, len(cmds))
	failed := false
	for i, cmd := range cmds {
		errs[i] = cmd.Err()
		failed = failed || errs[i] != nil
	}
	if err != nil && !failed {
		for i := range errs {
			errs[i] = err
		}
	}
	return errs
}

// Run runs s with EVALSHA, and once more with EVAL when Redis does not have
// it cached (NOSCRIPT: after a restart, a failover or SCRIPT FLUSH); on a
// Cluster, again while the Cluster does not run it (retry), until ctx's
// deadline. Errors are go-redis's, or a *RetryError wrapping one, not
// classified. On a Conn with Replication, the script's
// reply may come with a *ReplicationError: it ran, but its writes were not
// acknowledged by enough replicas.
func (c *Conn) Run(ctx context.Context, s Script, keys []string, args ...any) (*redis.Cmd, error) {
	if c.repl != nil {
		return c.runReplicated(ctx, s, keys, args)
	}
	return c.eval(ctx, s, keys, args, false)
}

// eval runs s with EVALSHA, and with EVAL on NOSCRIPT: through Process, or
// ProcessBulk when bulk; on a Cluster, again while it is not run (retry).
func (c *Conn) eval(ctx context.Context, s Script, keys []string, args []any, bulk bool) (*redis.Cmd, error) {
	var cmd *redis.Cmd
	err := c.retry(ctx, func(r route) error {
		cmd = redis.NewCmd(ctx, evalArgs("evalsha", s.sha, keys, args)...)
		err := c.send(ctx, cmd, keys, bulk, r)
		if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			cmd = redis.NewCmd(ctx, evalArgs("eval", s.src, keys, args)...)
			err = c.send(ctx, cmd, keys, bulk, r)
		}
		return err
	})
	return cmd, err
}

// send is one try of Process, or of ProcessBulk on the connection of
// keys[0] (after r) when bulk.
func (c *Conn) send(ctx context.Context, cmd redis.Cmder, keys []string, bulk bool, r route) error {
	if bulk {
		return c.processBulk(ctx, keys[0], r, cmd)
	}
	return c.process(ctx, cmd, r)
}

// evalArgs are the arguments of EVALSHA or EVAL. The keys go as pointers
// into keys, which go-redis reads as the strings (for the command, the
// batch's size and a Cluster slot): a pointer in an interface needs no
// allocation of its own, a string does.
func evalArgs(verb string, script any, keys []string, args []any) []any {
	a := make([]any, 0, 3+len(keys)+len(args))
	a = append(a, verb, script, len(keys))
	for i := range keys {
		a = append(a, &keys[i])
	}
	return append(a, args...)
}

// ReleaseFields deletes token's field of the lock key, and fields the
// holder kept in the lock beside it, in one HDEL: it deletes only the
// holder's own fields, and Redis deletes the key with its last field. It
// reports whether anything was deleted (false: the lock is not the
// holder's); its error is Classify's.
//
// The HDEL deletes the mark of a waiting request too (WaitedField): when
// it was there, the release is published on the lock's sharded channel, to
// wake the waiters (Conn.WatchRelease), in one more round trip that a
// release nobody waited for does not make.
func (c *Conn) ReleaseFields(ctx context.Context, key, token string, fields ...string) (bool, error) {
	cmd := hdelFields(ctx, key, token, fields)
	if err := c.Process(ctx, cmd); err != nil {
		return false, Classify(ctx, err)
	}
	return c.released(ctx, key, cmd, fields), nil
}

// GiveBackFields is ReleaseFields for a token whose acquire did not answer
// in time, and may still run after the release: a command that waited in
// one connection's socket buffer, or in the client's queue, runs after one
// sent later on another connection. Beside the HDEL it writes gone (the
// token's GoneKey) for ttl, one lease, which the acquire scripts check
// (take.lua's acquire), so that the late acquire takes nothing instead of
// holding the key for a lease that nobody renews or releases.
func (c *Conn) GiveBackFields(ctx context.Context, key, gone string, ttl time.Duration, token string, fields ...string) (bool, error) {
	mark := redis.NewStatusCmd(ctx, "set", gone, "1", "px", max(ttl.Milliseconds(), 1))
	cmd := hdelFields(ctx, key, token, fields)
	if err := c.ProcessAll(ctx, mark, cmd); err != nil {
		return false, Classify(ctx, err)
	}
	return c.released(ctx, key, cmd, fields), nil
}

// hdelFields is the HDEL of token's field of the lock key, fields the holder
// kept beside it, and the mark of a waiting request (WaitedField).
func hdelFields(ctx context.Context, key, token string, fields []string) *redis.IntCmd {
	args := make([]any, 0, 4+len(fields))
	args = append(args, "hdel", key, token)
	for _, f := range fields {
		args = append(args, f)
	}
	args = append(args, WaitedField(token))
	return redis.NewIntCmd(ctx, args...)
}

// released reports whether cmd, hdelFields' HDEL, deleted anything, and
// wakes the waiters when it deleted the waited mark too.
func (c *Conn) released(ctx context.Context, key string, cmd *redis.IntCmd, fields []string) bool {
	n := cmd.Val()
	if n == int64(len(fields)+2) {
		c.PublishRelease(ctx, key)
	}
	return n != 0
}

// WaitedField is the field of a lock that says a request waits for
// holder's release (take.lua's mark_waited). It exists only while holder's
// token does, so an HDEL of the holder's fields and it counts them all
// when the holder had the lock and was waited for.
func WaitedField(holder string) string { return "w:" + holder }

// PublishRelease wakes the requests waiting for the lock key: a message on
// its sharded channel, named as the key (so that it shares its slot). It
// is best effort: a waiter that misses it finds the lock free at its next
// poll.
func (c *Conn) PublishRelease(ctx context.Context, key string) {
	_ = c.Process(ctx, redis.NewIntCmd(ctx, "spublish", key, ""))
}
