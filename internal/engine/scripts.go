package engine

import (
	_ "embed"

	"github.com/reqlock/caddy-redis-lock/internal/redisscript"
)

// The scripts run with EVALSHA and fall back to EVAL on NOSCRIPT
// (redisscript's Conn.Run), so an empty script cache after a failover or
// SCRIPT FLUSH costs one extra round trip, never an error. Release needs no
// script: it is HDEL lock token.
var (
	//go:embed acquire.lua
	acquireSrc    string
	acquireScript = redisscript.New(redisscript.TakeLua + acquireSrc)

	//go:embed refresh.lua
	refreshSrc    string
	refreshScript = redisscript.New(refreshSrc)

	//go:embed raise.lua
	raiseSrc    string
	raiseScript = redisscript.New(raiseSrc)
)
