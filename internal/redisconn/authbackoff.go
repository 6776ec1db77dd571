package redisconn

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// authBackoff is go-redis's Limiter for one server: after Redis refused to
// authenticate a new connection (a wrong password, an unknown or disabled
// user), new connections are not tried for authBackoffFor, and commands
// fail at once. Without it every request dials, and is refused, on a
// connection of its own: thousands of connections a second, and as many
// sockets left in TIME_WAIT.
//
// As the one thing that sees every command's result on a server, it also
// tells the server's recovery (serverHealth).
type authBackoff struct {
	until   atomic.Int64
	refusal atomic.Pointer[error] // Redis's answer, for the log
	health  serverHealth
}

func newAuthBackoff(rec *Recovery) *authBackoff {
	return &authBackoff{health: serverHealth{recovery: rec}}
}

// authBackoffFor is how long connections are not tried after a refusal.
const authBackoffFor = time.Second

func (b *authBackoff) Allow() error {
	if time.Now().UnixNano() < b.until.Load() {
		return fmt.Errorf("not connecting again for %v after Redis refused to authenticate: %w", authBackoffFor, *b.refusal.Load())
	}
	return nil
}

func (b *authBackoff) ReportResult(err error) {
	b.health.report(err)
	if err != nil && (redis.HasErrorPrefix(err, "WRONGPASS") || redis.HasErrorPrefix(err, "NOAUTH")) {
		b.refusal.Store(&err)
		b.until.Store(time.Now().Add(authBackoffFor).UnixNano())
	}
}

// As a go-redis Hook, for a client whose options take no Limiter (the
// Sentinel failover client): dials fail at once during the backoff, and
// command results report refusals.
func (b *authBackoff) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if err := b.Allow(); err != nil {
			return nil, err
		}
		return next(ctx, network, addr)
	}
}

func (b *authBackoff) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		b.ReportResult(err)
		return err
	}
}

func (b *authBackoff) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		b.ReportResult(err)
		return err
	}
}
