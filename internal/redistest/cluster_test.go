package redistest

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestCluster runs its steps in order on one cluster, since starting one is
// the slow part: forms, routes by slot, manual failover, failover after a
// kill, and the killed master rejoining as a replica.
func TestCluster(t *testing.T) {
	t.Parallel()
	start := time.Now()
	c := StartCluster(t, 3, 1)
	t.Logf("cluster of 6 formed in %v", time.Since(start).Round(time.Millisecond))
	ctx := Context(t, 3*time.Minute)
	const key, val = "redis_lock:{cluster}", "v1"

	step(t, "forms", func(t *testing.T) {
		if n := len(c.Addrs()); n != 6 {
			t.Fatalf("%d nodes, want 6", n)
		}
		ms := c.MasterAddrs()
		if len(ms) != 3 {
			t.Fatalf("masters %v, want 3", ms)
		}
		for _, m := range ms {
			if r := c.ReplicasOf(m); len(r) != 1 {
				t.Fatalf("master %s has replicas %v, want 1", m, r)
			}
			if c.Node(m) == nil {
				t.Fatalf("Node(%s) is nil", m)
			}
		}
	})

	step(t, "routes by slot", func(t *testing.T) {
		slot, err := DoString(ctx, c.Addrs()[0], nil, "CLUSTER", "KEYSLOT", key)
		if err != nil {
			t.Fatal(err)
		}
		owner, err := c.MasterForKey(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Do(ctx, owner, nil, "SET", key, val); err != nil {
			t.Fatalf("SET on the slot's master %s: %v", owner, err)
		}
		// Replicated before the failovers below, so the value must survive.
		if n, err := Do(ctx, owner, nil, "WAIT", "1", "5000"); err != nil || n != int64(1) {
			t.Fatalf("WAIT 1: %v %v", n, err)
		}
		for _, m := range c.MasterAddrs() {
			if m == owner {
				continue
			}
			_, err := Do(ctx, m, nil, "GET", key)
			var re *Error
			if !errors.As(err, &re) || re.Msg != "MOVED "+slot+" "+owner {
				t.Fatalf("GET on %s: %v, want MOVED %s %s", m, err, slot, owner)
			}
		}
		// A replica redirects too, unless the connection said READONLY.
		r := c.ReplicasOf(owner)[0]
		conn, err := Dial(ctx, r, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := conn.Do(ctx, "GET", key); err == nil || !strings.HasPrefix(err.Error(), "MOVED ") {
			t.Fatalf("GET on replica %s: %v, want MOVED", r, err)
		}
		if _, err := conn.Do(ctx, "READONLY"); err != nil {
			t.Fatal(err)
		}
		// After WAIT, a replica's read has been seen to lag under load
		// (once, with other packages' tests running).
		Eventually(t, 5*time.Second, "READONLY GET on the replica answers the value", func() bool {
			got, err := conn.Do(ctx, "GET", key)
			if err != nil {
				t.Fatalf("READONLY GET on replica: %v", err)
			}
			return got == val
		})
	})

	step(t, "manual failover", func(t *testing.T) {
		old, _ := c.MasterForKey(ctx, key)
		r := c.ReplicasOf(old)[0]
		start := time.Now()
		if err := c.FailoverManual(ctx, r); err != nil {
			t.Fatal(err)
		}
		t.Logf("manual failover %s -> %s took %v", old, r, time.Since(start).Round(time.Millisecond))
		if m, _ := c.MasterForKey(ctx, key); m != r {
			t.Fatalf("key served by %s, want the promoted %s", m, r)
		}
		if got := c.ReplicasOf(r); !slices.Equal(got, []string{old}) {
			t.Fatalf("replicas of %s: %v, want the old master %s", r, got, old)
		}
		if got, err := Do(ctx, r, nil, "GET", key); err != nil || got != val {
			t.Fatalf("GET after failover: %v %v", got, err)
		}
	})

	var killed, promoted string
	step(t, "failover after kill", func(t *testing.T) {
		killed, _ = c.MasterForKey(ctx, key)
		replica := c.ReplicasOf(killed)[0]
		if n, err := Do(ctx, killed, nil, "WAIT", "1", "5000"); err != nil || n != int64(1) {
			t.Fatalf("WAIT 1: %v %v", n, err)
		}
		start := time.Now()
		if err := c.KillMaster(killed); err != nil {
			t.Fatal(err)
		}
		if err := c.WaitFailover(ctx, killed); err != nil {
			t.Fatal(err)
		}
		t.Logf("failover after killing %s took %v", killed, time.Since(start).Round(time.Millisecond))
		promoted, _ = c.MasterForKey(ctx, key)
		if promoted != replica {
			t.Fatalf("key served by %s, want the replica %s", promoted, replica)
		}
		if ms := c.MasterAddrs(); len(ms) != 3 || slices.Contains(ms, killed) {
			t.Fatalf("masters after failover: %v", ms)
		}
		if got, err := Do(ctx, promoted, nil, "GET", key); err != nil || got != val {
			t.Fatalf("GET after failover: %v %v", got, err)
		}
		for _, a := range c.Addrs() {
			if c.Node(a).Running() && !slices.Contains(c.MasterAddrs(), a) {
				if err := c.KillMaster(a); err == nil {
					t.Fatalf("KillMaster of the replica %s did not fail", a)
				}
			}
		}
	})

	step(t, "killed master rejoins as replica", func(t *testing.T) {
		if err := c.Node(killed).Restart(); err != nil {
			t.Fatal(err)
		}
		if err := c.WaitHealthy(ctx); err != nil {
			t.Fatal(err)
		}
		if got := c.ReplicasOf(promoted); !slices.Equal(got, []string{killed}) {
			t.Fatalf("replicas of %s: %v, want %s", promoted, got, killed)
		}
	})
}

// step runs one step of a scenario as a subtest and stops the scenario at the
// first failed step, whose successors would only fail confusingly.
func step(t *testing.T, name string, f func(t *testing.T)) {
	t.Helper()
	if !t.Run(name, f) {
		t.FailNow()
	}
}

func TestClusterPortHasFreeBus(t *testing.T) {
	for range 20 {
		p, err := clusterPort()
		if err != nil {
			t.Fatal(err)
		}
		if p >= 55000 {
			t.Fatalf("port %d not below 55000", p)
		}
	}
}
