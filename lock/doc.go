// Package lock is a Redis lock that lets one holder at a time, across any
// number of processes, work on a named resource. Acquire takes the lock in
// one round trip and, in the same step, issues a fencing token larger than
// every earlier holder's; a keep-alive renews the lease and cancels the
// lock's Context as soon as the lock may have been lost (Redis reports
// another holder, or the local lease deadline passes without a successful
// renewal); Release deletes the lock only if it is still the caller's. A
// Client works through a Backend: Redis, on any go-redis client (a
// standalone server, a Sentinel-managed primary, a Cluster: a lock and its
// fencing counter share a hash slot), or Redlock over several independent
// masters. It does not depend on Caddy.
//
// It is the public face of the lock engine (internal/engine) that the
// redis_lock Caddy handler and its idempotency records (package record)
// run on: the same Client, locks, scripts and key layout.
//
// A lease is a timing assumption: a holder that pauses for longer than its
// lease can still act after another holder has taken over. Where that
// matters, pass Lock.Fence to the protected resource with every write and
// have the resource reject a token lower than the highest it has accepted.
package lock
