package lock

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

// TakeLua is the Lua that takes a lock and issues its fencing token, for
// scripts of other packages that take one in the same round trip as their
// own work: prefix their source with it and call
// take(lock_key, token, lease_ms, counter_key), which returns the fencing
// token or an error reply.
//
//go:embed take.lua
var TakeLua string

// The scripts run with EVALSHA and fall back to EVAL on NOSCRIPT (Run), so an
// empty script cache after a failover or SCRIPT FLUSH costs one extra round
// trip, never an error. Release needs no script: it is HDEL lock token.
var (
	//go:embed acquire.lua
	acquireSrc    string
	acquireScript = NewScript(TakeLua + acquireSrc)

	//go:embed refresh.lua
	refreshSrc    string
	refreshScript = NewScript(refreshSrc)

	//go:embed raise.lua
	raiseSrc    string
	raiseScript = NewScript(raiseSrc)
)

// Script is a Lua script and its SHA1, the name EVALSHA knows it by.
type Script struct{ src, sha string }

// NewScript returns the Script of src.
func NewScript(src string) Script {
	return Script{src: src, sha: redis.NewScript(src).Hash()}
}
