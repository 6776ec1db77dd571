package engine

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// Key builds the Redis key for a lock: prefix + "{" + h[:4] + "}" + h, where
// h is the hex SHA-256 of scope + NUL + name. Hashing keeps client data out
// of Redis key names and keys fixed-length. The braces are a Cluster hash
// tag: the lock, its fencing counter (CounterKey) and an idempotency record
// share a slot, and the 65,536 tags spread the locks evenly over the
// slots (and so over a Cluster's masters).
func Key(prefix, scope, name string) string {
	h := sha256.New()
	h.Write([]byte(scope))
	h.Write([]byte{0})
	h.Write([]byte(name))
	var sum [sha256.Size]byte
	var hexed [2 * sha256.Size]byte
	hex.Encode(hexed[:], h.Sum(sum[:0]))
	return prefix + "{" + string(hexed[:4]) + "}" + string(hexed[:])
}

// untaggedCounterKey is the fencing counter of lock keys without a Cluster
// hash tag (keys not made by Key): one for all of them, which a Redis
// Cluster cannot use with the lock in one script.
const untaggedCounterKey = "redis_lock:fence"

// CounterKey is the fencing counter of a lock key: the key up to the end of
// its hash tag, then "fence" (prefix{h4}fence for a key from Key), so that
// it shares the lock's slot. Counters are few (at most 65,536 per prefix)
// and have no TTL; each lock key has exactly one, so its tokens strictly
// increase. A key without a hash tag has untaggedCounterKey.
func CounterKey(lockKey string) string {
	open := strings.IndexByte(lockKey, '{')
	if open < 0 {
		return untaggedCounterKey
	}
	end := strings.IndexByte(lockKey[open+1:], '}')
	if end <= 0 { // no tag, or an empty one: Redis hashes the whole key
		return untaggedCounterKey
	}
	return lockKey[:open+1+end+1] + "fence"
}

// GoneKey marks token given back on lockKey: the acquire scripts take
// nothing for a token whose mark exists (Redis's GiveBack). It shares the
// lock's hash tag, and lives one lease.
func GoneKey(lockKey, token string) string { return lockKey + ":gone:" + token }
