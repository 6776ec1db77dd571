package lock

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

// The scripts run with EVALSHA and fall back to EVAL on NOSCRIPT (go-redis's
// Script.Run), so an empty script cache after a failover or SCRIPT FLUSH costs
// one extra round trip, never an error. Release needs no script: it is
// HDEL lock token.
var (
	//go:embed acquire.lua
	acquireSrc    string
	acquireScript = redis.NewScript(acquireSrc)

	//go:embed refresh.lua
	refreshSrc    string
	refreshScript = redis.NewScript(refreshSrc)
)
