package redistest

import (
	"testing"
	"time"
)

// TestSentinel runs its steps in order on one topology: forms, SENTINEL
// FAILOVER, failover after a kill, and the killed master rejoining.
func TestSentinel(t *testing.T) {
	t.Parallel()
	start := time.Now()
	s := StartSentinel(t)
	t.Logf("sentinel topology formed in %v", time.Since(start).Round(time.Millisecond))
	ctx := Context(t, 3*time.Minute)
	first, second := s.Addrs()[0], s.Addrs()[1]
	const key, val = "redis_lock:sentinel", "v1"

	step(t, "forms", func(t *testing.T) {
		if s.MasterName() == "" || len(s.SentinelAddrs()) != 3 {
			t.Fatalf("name %q, sentinels %v", s.MasterName(), s.SentinelAddrs())
		}
		m, err := s.MasterAddr(ctx)
		if err != nil || m != first {
			t.Fatalf("master %q (%v), want %s", m, err, first)
		}
		if err := replicaOf(ctx, second, s.Node(first).Port); err != nil {
			t.Fatal(err)
		}
		if _, err := Do(ctx, m, nil, "SET", key, val); err != nil {
			t.Fatal(err)
		}
		if n, err := Do(ctx, m, nil, "WAIT", "1", "5000"); err != nil || n != int64(1) {
			t.Fatalf("WAIT 1: %v %v", n, err)
		}
	})

	step(t, "SENTINEL FAILOVER", func(t *testing.T) {
		start := time.Now()
		m, err := s.Failover(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("SENTINEL FAILOVER took %v", time.Since(start).Round(time.Millisecond))
		if m != second {
			t.Fatalf("new master %s, want %s", m, second)
		}
		if err := replicaOf(ctx, first, s.Node(second).Port); err != nil {
			t.Fatalf("old master is not the new one's replica: %v", err)
		}
		if got, err := Do(ctx, m, nil, "GET", key); err != nil || got != val {
			t.Fatalf("GET on the new master: %v %v", got, err)
		}
	})

	step(t, "failover after kill", func(t *testing.T) {
		if n, err := Do(ctx, second, nil, "WAIT", "1", "5000"); err != nil || n != int64(1) {
			t.Fatalf("WAIT 1: %v %v", n, err)
		}
		start := time.Now()
		m, err := s.KillMaster(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("failover after kill took %v", time.Since(start).Round(time.Millisecond))
		if m != first || s.Node(second).Running() {
			t.Fatalf("new master %s (old running: %v), want %s", m, s.Node(second).Running(), first)
		}
		if got, err := s.MasterAddr(ctx); got != first {
			t.Fatalf("MasterAddr %q %v", got, err)
		}
		if got, err := Do(ctx, m, nil, "GET", key); err != nil || got != val {
			t.Fatalf("GET on the new master: %v %v", got, err)
		}
	})

	step(t, "killed master rejoins as replica", func(t *testing.T) {
		start := time.Now()
		if err := s.Node(second).Restart(); err != nil {
			t.Fatal(err)
		}
		if _, err := s.WaitStable(ctx); err != nil {
			t.Fatal(err)
		}
		t.Logf("rejoined in %v", time.Since(start).Round(time.Millisecond))
		if err := replicaOf(ctx, second, s.Node(first).Port); err != nil {
			t.Fatal(err)
		}
	})
}
