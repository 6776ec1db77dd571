// Package record keeps the outcome of a request under its idempotency key,
// beside the key's lock, so that a retry of the request gets the stored
// response instead of running again. A Store works on a Client of the lock
// engine (internal/engine), as the Caddy handler does: it takes its locks
// in its own scripts, through the engine's API.
//
// A record is created in progress, atomically with the lock, in one script:
// it holds the request's fingerprint and its owner's token, and lives as
// long as the lock's lease. Completing it stores the response for the
// retention time and releases the lock in one script too. Every transition
// is token-checked, so a holder whose lease ran out never overwrites what a
// later holder wrote. The package does not depend on Caddy.
package record
