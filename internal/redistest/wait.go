package redistest

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// eventually runs check until it returns nil, every interval, until ctx ends;
// the error then names what was still wrong, not just "timeout".
func eventually(ctx context.Context, what string, check func(ctx context.Context) error) error {
	var last error
	for {
		attempt, cancel := context.WithTimeout(ctx, 2*time.Second)
		last = check(attempt)
		cancel()
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("redistest: %s: %w (last: %v)", what, ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

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
