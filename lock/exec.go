package lock

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// submitter is go-redis's deferred autopipeliner (AsyncAutoPipeline). A
// command queued there is sent when its batch's turn comes whatever its
// context says, so a call waits on its future and gives up at its own
// deadline; the blocking face would wait for the batch however long it
// takes.
type submitter interface {
	Submit(ctx context.Context, cmd redis.Cmder) redis.AutoFuture
	IsBlocking() bool
}

// process runs cmd and waits for its reply at most until ctx ends. After a
// context error cmd must not be read: its batch may still complete it.
func (c *Client) process(ctx context.Context, cmd redis.Cmder) error {
	if c.async != nil {
		return c.async.Submit(ctx, cmd).WaitContext(ctx)
	}
	return c.rdb.Process(ctx, cmd)
}

// runScript runs s with EVALSHA, and once more with EVAL when Redis does not
// have it cached (NOSCRIPT: after a restart, a failover or SCRIPT FLUSH).
func (c *Client) runScript(ctx context.Context, s script, keys []string, args ...any) (*redis.Cmd, error) {
	cmd := redis.NewCmd(ctx, evalArgs("evalsha", s.sha, keys, args)...)
	err := c.process(ctx, cmd)
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		cmd = redis.NewCmd(ctx, evalArgs("eval", s.src, keys, args)...)
		err = c.process(ctx, cmd)
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

// callContext bounds one Redis call by CallTimeout, when set.
func (c *Client) callContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if c.cfg.CallTimeout > 0 {
		return context.WithTimeout(ctx, c.cfg.CallTimeout)
	}
	return ctx, func() {}
}

// background runs f on a context detached from ctx's cancellation, unless
// MaxBackground calls are already running: then f is dropped, as the lease
// ends what it would have cleaned up. It reports whether f runs.
func (c *Client) background(ctx context.Context, f func(context.Context)) bool {
	select {
	case c.bg <- struct{}{}:
	default:
		return false
	}
	go func() {
		defer func() { <-c.bg }()
		f(context.WithoutCancel(ctx))
	}()
	return true
}
