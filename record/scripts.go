package record

import (
	_ "embed"

	"github.com/reqlock/caddy-redis-lock/lock"
)

var (
	//go:embed begin.lua
	beginSrc    string
	beginScript = lock.NewScript(lock.TakeLua + beginSrc)

	//go:embed refresh.lua
	refreshSrc    string
	refreshScript = lock.NewScript(refreshSrc)

	//go:embed abandon.lua
	abandonSrc    string
	abandonScript = lock.NewScript(abandonSrc)

	//go:embed complete.lua
	completeSrc    string
	completeScript = lock.NewScript(completeSrc)
)
