package lock

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis is the Backend of one Redis deployment, through any go-redis client:
// a standalone server, a Sentinel-managed primary, a Cluster. The lock is a
// hash whose one field is the holder's token (its value the fencing token),
// so that release is the native HDEL; acquire and refresh are Lua scripts.
type Redis struct {
	rdb   redis.UniversalClient
	async submitter // rdb as a deferred autopipeliner, else nil
}

// NewRedis returns the Backend of rdb. For context deadlines to bound each
// call, create rdb with ContextTimeoutEnabled. A deferred autopipeliner
// (AsyncAutoPipeline) shares round trips between concurrent callers, and
// each call still gives up waiting at its deadline.
func NewRedis(rdb redis.UniversalClient) *Redis {
	r := &Redis{rdb: rdb}
	if s, ok := rdb.(submitter); ok && !s.IsBlocking() {
		r.async = s
	}
	return r
}

// TryAcquire runs the acquire script: the lock and its fencing token, or the
// holder's remaining lease.
func (r *Redis) TryAcquire(ctx context.Context, key, token string, ttl time.Duration) (int64, error) {
	cmd, err := r.Run(ctx, acquireScript, []string{key, CounterKey(key)}, token, ttl.Milliseconds())
	if err != nil {
		return 0, Classify(ctx, err)
	}
	return ParseGrant(ctx, cmd.Val())
}

// ParseGrant reads the reply of a script that takes a lock as acquire.lua
// does: the fencing token as a decimal string when the lock is ours, the
// holder's PTTL as an integer when it is not (a *NotObtainedError).
func ParseGrant(ctx context.Context, reply any) (int64, error) {
	switch v := reply.(type) {
	case string:
		if fence, err := strconv.ParseInt(v, 10, 64); err == nil {
			return fence, nil
		}
	case int64: // negative: no TTL, or just gone
		return 0, &NotObtainedError{Remaining: max(time.Duration(v), 0) * time.Millisecond}
	}
	return 0, Classify(ctx, fmt.Errorf("unexpected reply from a lock script: %T %v", reply, reply))
}

// Refresh extends key's lease to ttl if it still holds token.
func (r *Redis) Refresh(ctx context.Context, key, token string, ttl time.Duration) error {
	cmd, err := r.Run(ctx, refreshScript, []string{key}, token, ttl.Milliseconds())
	if err != nil {
		return Classify(ctx, err)
	}
	n, err := cmd.Int64()
	if err != nil {
		return Classify(ctx, err)
	}
	if n != 1 {
		return ErrNotHeld
	}
	return nil
}

// Release deletes key if it still holds token: HDEL deletes only our own
// field, and Redis deletes the key with its last field. No script, so no
// script cache to miss either.
func (r *Redis) Release(ctx context.Context, key, token string) error {
	return r.ReleaseFields(ctx, key, token)
}

// ReleaseFields is Release that also deletes fields the holder kept in the
// lock beside its token (in the same HDEL).
func (r *Redis) ReleaseFields(ctx context.Context, key, token string, fields ...string) error {
	args := make([]any, 0, 3+len(fields))
	args = append(args, "hdel", key, token)
	for _, f := range fields {
		args = append(args, f)
	}
	cmd := redis.NewIntCmd(ctx, args...)
	if err := r.Process(ctx, cmd); err != nil {
		return Classify(ctx, err)
	}
	if cmd.Val() == 0 {
		return ErrNotHeld
	}
	return nil
}

// RaiseFence sets the fencing counter of key to fence unless it is already
// at or above it: Redlock writes the winning token back to a majority, so
// that every later majority issues larger ones.
func (r *Redis) RaiseFence(ctx context.Context, key string, fence int64) error {
	if _, err := r.Run(ctx, raiseScript, []string{CounterKey(key)}, strconv.FormatInt(fence, 10)); err != nil {
		return Classify(ctx, err)
	}
	return nil
}

// submitter is go-redis's deferred autopipeliner (AsyncAutoPipeline). A
// command queued there is sent when its batch's turn comes whatever its
// context says, so a call waits on its future and gives up at its own
// deadline; the blocking face would wait for the batch however long it
// takes.
type submitter interface {
	Submit(ctx context.Context, cmd redis.Cmder) redis.AutoFuture
	IsBlocking() bool
}

// Process runs cmd and waits for its reply at most until ctx ends. After a
// context error cmd must not be read: its batch may still complete it.
func (r *Redis) Process(ctx context.Context, cmd redis.Cmder) error {
	if r.async != nil {
		return r.async.Submit(ctx, cmd).WaitContext(ctx)
	}
	return r.rdb.Process(ctx, cmd)
}

// ProcessAll runs cmds in order and waits for all of them, at most until
// ctx ends. Through a deferred autopipeliner they are queued one after the
// other on its ordered stream, where they share batches (a round trip each
// batch) with other callers' commands, as the lock's own commands do; on
// another client they are one pipeline. The error is the first command's
// that failed.
func (r *Redis) ProcessAll(ctx context.Context, cmds ...redis.Cmder) error {
	if r.async == nil {
		_, err := r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, cmd := range cmds {
				_ = p.Process(ctx, cmd)
			}
			return nil
		})
		return err
	}
	futures := make([]redis.AutoFuture, len(cmds))
	for i, cmd := range cmds {
		futures[i] = r.async.Submit(ctx, cmd)
	}
	var first error
	for _, f := range futures {
		if err := f.WaitContext(ctx); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Run runs s with EVALSHA, and once more with EVAL when Redis does not have
// it cached (NOSCRIPT: after a restart, a failover or SCRIPT FLUSH). Errors
// are go-redis's, not classified.
func (r *Redis) Run(ctx context.Context, s Script, keys []string, args ...any) (*redis.Cmd, error) {
	cmd := redis.NewCmd(ctx, evalArgs("evalsha", s.sha, keys, args)...)
	err := r.Process(ctx, cmd)
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		cmd = redis.NewCmd(ctx, evalArgs("eval", s.src, keys, args)...)
		err = r.Process(ctx, cmd)
	}
	return cmd, err
}

func evalArgs(verb, script string, keys []string, args []any) []any {
	a := make([]any, 0, 3+len(keys)+len(args))
	a = append(a, verb, script, len(keys))
	for _, k := range keys {
		a = append(a, k)
	}
	return append(a, args...)
}

var _ Backend = (*Redis)(nil)
