package redistest

import (
	"testing"
	"time"
)

// Eventually polls cond every 5ms until it holds, failing tb when d passes
// first: for conditions that another process (Redis, Caddy) makes true in
// its own time.
func Eventually(tb testing.TB, d time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("not within %v: %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
