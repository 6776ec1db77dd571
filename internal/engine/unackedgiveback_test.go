package engine

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// unackedBackend gives back every token, taking a WAIT's time for each;
// those in unacked are made but never acknowledged by the replicas.
type unackedBackend struct {
	Backend
	wait    time.Duration
	unacked map[string]bool
	mu      sync.Mutex
	tries   map[string][]time.Time
}

func (b *unackedBackend) GiveBack(ctx context.Context, key, token string, ttl time.Duration) error {
	b.mu.Lock()
	b.tries[token] = append(b.tries[token], time.Now())
	b.mu.Unlock()
	time.Sleep(b.wait)
	if b.unacked[token] {
		return fmt.Errorf("%w: %w", ErrUnavailable, ErrNotReplicated)
	}
	return nil
}

func (b *unackedBackend) triesOf(token string) []time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]time.Time(nil), b.tries[token]...)
}

// Give-backs the replicas did not acknowledge (a primary with no replica,
// as after a failover) are tried again, but never ahead of a fresh one
// and at most every unackedGiveBackPause: a thousand of them, each a WAIT
// long, do not hold back a give-back whose begin may still take its key.
func TestUnackedGiveBacksDoNotHoldBackFreshOnes(t *testing.T) {
	c := New(nil, &Config{MaxBackground: maxGiveBackWorkers})
	b := &unackedBackend{wait: 100 * time.Millisecond, unacked: map[string]bool{}, tries: map[string][]time.Time{}}
	const n = 1000
	for i := range n {
		b.unacked[fmt.Sprintf("unacked-%d", i)] = true
	}
	for i := range n {
		c.giveBackUntilAnswered(b, "k", fmt.Sprintf("unacked-%d", i), time.Second)
	}
	// Every one tried once: n x wait over the workers.
	first := time.Now().Add(time.Duration(n/maxGiveBackWorkers+2) * b.wait)
	for time.Now().Before(first) && len(b.triesOf(fmt.Sprintf("unacked-%d", n-1))) == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	added := time.Now()
	c.giveBackUntilAnswered(b, "k", "fresh", time.Second)
	var tried []time.Time
	for time.Since(added) < 5*time.Second {
		if tried = b.triesOf("fresh"); len(tried) > 0 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if len(tried) == 0 {
		t.Fatal("the fresh give-back was never tried")
	}
	// A worker is free within one try (wait); one pass over the
	// unacknowledged ones would take n/workers tries.
	if took := tried[0].Sub(added); took > 3*b.wait {
		t.Fatalf("the fresh give-back was done %v after it was added, behind the unacknowledged ones (one try takes %v)", took, b.wait)
	}
	for _, tok := range []string{"unacked-0", fmt.Sprintf("unacked-%d", n/2)} {
		ts := b.triesOf(tok)
		for i := 1; i < len(ts); i++ {
			if gap := ts[i].Sub(ts[i-1]); gap < unackedGiveBackPause {
				t.Fatalf("%s tried again %v after its last try, want at least %v", tok, gap, unackedGiveBackPause)
			}
		}
	}
	t.Logf("fresh give-back done %v after it was added, beside %d unacknowledged ones", tried[0].Sub(added), n)
}
