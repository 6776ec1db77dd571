package lock

import "github.com/reqlock/caddy-redis-lock/internal/engine"

// Key builds the Redis key for a lock: prefix + "{" + h[:4] + "}" + h, where
// h is the hex SHA-256 of scope + NUL + name. Hashing keeps client data out
// of Redis key names and keys fixed-length. The braces are a Cluster hash
// tag: the lock and its fencing counter (CounterKey) share a slot, and the
// 65,536 tags spread the locks evenly over the slots (and so over a
// Cluster's masters).
func Key(prefix, scope, name string) string { return engine.Key(prefix, scope, name) }

// CounterKey is the fencing counter of a lock key: the key up to the end of
// its hash tag, then "fence" (prefix{h4}fence for a key from Key), so that
// it shares the lock's slot. Counters are few (at most 65,536 per prefix)
// and have no TTL; each lock key has exactly one, so its tokens strictly
// increase. A key without a hash tag (not made by Key) shares one counter,
// "redis_lock:fence", with every other such key, which a Redis Cluster
// cannot use with the lock in one script.
func CounterKey(lockKey string) string { return engine.CounterKey(lockKey) }
