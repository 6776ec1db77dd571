package record

import (
	"context"
	_ "embed"
	"time"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
	"github.com/reqlock/caddy-redis-lock/internal/redisscript"
)

// Refresh is the lock's own script, and completing a request that still
// holds its lock and giving one up are native commands (see Store).
var (
	//go:embed begin.lua
	beginSrc    string
	beginScript = redisscript.New(redisscript.TakeLua + beginSrc)

	//go:embed complete.lua
	completeSrc    string
	completeScript = redisscript.New(completeSrc)
)

// notObtained is the error of a lock another request holds for remaining.
func notObtained(remaining time.Duration) error {
	return &engine.NotObtainedError{Remaining: remaining}
}

// releaseFields deletes token and fields of the lock key on node (one
// HDEL), or returns engine.ErrNotHeld when the lock is not token's.
func releaseFields(ctx context.Context, node *engine.Redis, key, token string, fields ...string) error {
	released, err := node.Conn().ReleaseFields(ctx, key, token, fields...)
	if err == nil && !released {
		return engine.ErrNotHeld
	}
	return err
}
