package redisconn

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// SetLogger sends go-redis's own messages (dial failures, ...), of every
// client in the process, to l at debug level instead of to stderr: the
// handler already warns about every request that Redis failed.
func SetLogger(l *zap.Logger) { redis.SetLogger(goRedisLogger{l}) }

// goRedisLogger is go-redis's logger on a zap.Logger.
type goRedisLogger struct{ l *zap.Logger }

func (g goRedisLogger) Printf(_ context.Context, format string, v ...any) {
	if ce := g.l.Check(zapcore.DebugLevel, "go-redis"); ce != nil {
		ce.Write(zap.String("message", fmt.Sprintf(format, v...)))
	}
}
