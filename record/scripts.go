package record

import (
	"context"
	_ "embed"
	"time"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
	"github.com/reqlock/caddy-redis-lock/internal/redisscript"
)

// The record's scripts; its lock is refreshed with the lock's own.
var (
	//go:embed begin.lua
	beginSrc    string
	beginScript = redisscript.New(redisscript.TakeLua + beginSrc)

	//go:embed complete.lua
	completeSrc    string
	completeScript = redisscript.New(completeSrc)

	//go:embed release.lua
	releaseSrc    string
	releaseScript = redisscript.New(releaseSrc)
)

// notObtained is the error of a lock another request holds for remaining.
func notObtained(remaining time.Duration) error {
	return &engine.NotObtainedError{Remaining: remaining}
}

// giveUp runs release.lua on node: keys are the lock's, the record's and,
// for a give-back, the token's mark; args the token and the mark's
// lifetime. It returns engine.ErrNotHeld when nothing was the holder's,
// and an error that matches ErrUnavailable while the replicas (with
// `replicas`) have not acknowledged the removal, also when this try found
// nothing: an earlier try's removal, made on a primary that fails over
// before its replicas had it, would come back with the new primary, its
// record in progress abandoned, so the caller tries again until one is
// acknowledged.
func giveUp(ctx context.Context, node *engine.Redis, keys []string, token string, markFor ...any) error {
	cmd, err := node.Conn().Run(ctx, releaseScript, keys, append([]any{token}, markFor...)...)
	if err != nil && !redisscript.Unreplicated(err) {
		return redisscript.Classify(ctx, err)
	}
	if n, _ := cmd.Int64(); n == 0 && err == nil {
		return engine.ErrNotHeld
	}
	return redisscript.Classify(ctx, err)
}
