// Package engine is the lock engine under package lock, package record and
// the Caddy handler: the Client (waiting, keep-alive, the local lease
// deadline, bounds on each call, give-backs after calls whose reply did not
// come, background work), the Lock it hands out, and the Backends locks
// live on (Redis, one deployment; Redlock, several masters). Package lock
// is its public face for Go programs; package record and the handler use
// it directly, for what they do beside a lock in the same scripts (the
// idempotency records) and in the same request (releases in the
// background, work after the client has its answer).
package engine
