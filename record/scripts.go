package record

import (
	_ "embed"

	"github.com/reqlock/caddy-redis-lock/lock"
)

// Refresh is the lock's own script, and completing a request that still
// holds its lock and giving one up are native commands (see Store).
var (
	//go:embed begin.lua
	beginSrc    string
	beginScript = lock.NewScript(lock.TakeLua + beginSrc)

	//go:embed complete.lua
	completeSrc    string
	completeScript = lock.NewScript(completeSrc)
)
