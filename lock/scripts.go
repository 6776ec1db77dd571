package lock

import (
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
)

// The scripts run with EVALSHA and fall back to EVAL on NOSCRIPT (runScript),
// so an empty script cache after a failover or SCRIPT FLUSH costs one extra
// round trip, never an error. Release needs no script: it is HDEL lock token.
var (
	//go:embed acquire.lua
	acquireSrc    string
	acquireScript = newScript(acquireSrc)

	//go:embed refresh.lua
	refreshSrc    string
	refreshScript = newScript(refreshSrc)
)

// script is a Lua script and its SHA1, the name EVALSHA knows it by.
type script struct{ src, sha string }

func newScript(src string) script {
	sum := sha1.Sum([]byte(src))
	return script{src: src, sha: hex.EncodeToString(sum[:])}
}
