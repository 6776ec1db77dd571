package redislock

// The handler on real local Redis topologies that the tests start
// themselves: a Cluster of 3 masters with a replica each, a master with a
// replica watched by 3 Sentinels, and 3 and 5 independent Redlock masters.
// In each, exclusion holds with two Caddy processes and concurrent
// duplicates, fencing tokens increase, and the topology's failures are met.

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
	"github.com/reqlock/caddy-redis-lock/internal/redistest"
	"github.com/reqlock/caddy-redis-lock/record"
)

// get is GET key on addr through the test RESP client; "" when absent.
func get(t *testing.T, addr, key string) string {
	t.Helper()
	v, err := redistest.Do(context.Background(), addr, nil, "GET", key)
	if err != nil {
		t.Fatalf("GET %s on %s: %v", key, addr, err)
	}
	s, _ := v.(string)
	return s
}

func TestClusterTopology(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 3, 1)
	redisLine := "redis {\n\t\t\tmode cluster\n\t\t\taddress " + strings.Join(c.MasterAddrs(), " ") + "\n\t\t}"
	st := stormTwoNodes(t, redisLine, 20, 8)
	st.nextFencesIncrease(t)

	// The locks spread over the masters: each key's counter lives on the
	// master of its slot.
	perMaster := map[string]int{}
	for k := range 20 {
		counter := engine.CounterKey(defaultKey(fmt.Sprintf("e2e-key-%02d", k)))
		m, err := c.MasterForKey(context.Background(), counter)
		if err != nil {
			t.Fatal(err)
		}
		if get(t, m, counter) == "" {
			t.Fatalf("counter %s is not on %s, the master of its slot", counter, m)
		}
		perMaster[m]++
	}
	if len(perMaster) != 3 {
		t.Errorf("20 keys' counters on %d masters, want all 3: %v", len(perMaster), perMaster)
	}

	// A master fails and its replica takes over; the client follows the
	// new layout (MOVED) and the keys of its slots lock again.
	key := "e2e-key-00"
	victim, err := c.MasterForKey(context.Background(), defaultKey(key))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.KillMaster(victim); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.WaitFailover(ctx, victim); err != nil {
		t.Fatal(err)
	}
	var r *response
	redistest.Eventually(t, 20*time.Second, "a lock after the failover", func() bool {
		var err error
		r, err = sendRequest(context.Background(), st.client, "POST", st.nodes[0].URL+"/pay", `{}`, "Idempotency-Key", key)
		return err == nil && r.Status == 200
	})
	promoted, err := c.MasterForKey(context.Background(), defaultKey(key))
	if err != nil || promoted == victim {
		t.Fatalf("master of %s after the failover: %s, %v", key, promoted, err)
	}
	st.nextFencesIncrease(t)
}

// Idempotency on a Cluster: the record lives in its lock's slot and is
// replayed through the other node.
func TestClusterIdempotency(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 3, 0)
	bin := buildCaddyBinary(t)
	be := chargeBackend(t)
	site := fmt.Sprintf(`	redis_lock /pay* {http.request.header.Idempotency-Key} {
		redis {
			mode cluster
			address %s
		}
		idempotency
	}
	reverse_proxy %s`, c.MasterAddrs()[0], be.hostPort())
	a, b := startCaddyProcess(t, bin, "caddy-a", site), startCaddyProcess(t, bin, "caddy-b", site)
	client := &http.Client{Timeout: 10 * time.Second}
	for k := range 10 {
		key := fmt.Sprintf("cluster-idem-%d", k)
		first, err := sendRequest(context.Background(), client, "POST", a.URL+"/pay", `{}`, "Idempotency-Key", key)
		if err != nil || first.Status != http.StatusCreated {
			t.Fatalf("%s: %v %v", key, first, err)
		}
		again, err := sendRequest(context.Background(), client, "POST", b.URL+"/pay", `{}`, "Idempotency-Key", key)
		if err != nil || again.Body != first.Body || again.Header.Get(replayedHeader) != "true" {
			t.Fatalf("%s on the other node: %v %v", key, again, err)
		}
		rk := record.Key(defaultKey(key))
		m, err := c.MasterForKey(context.Background(), rk)
		if err != nil {
			t.Fatal(err)
		}
		if lm, _ := c.MasterForKey(context.Background(), defaultKey(key)); lm != m || get(t, m, rk) == "" {
			t.Fatalf("%s: record on %s, lock's master %s", key, m, lm)
		}
	}
	if be.executions() != 10 {
		t.Fatalf("backend ran %d times for 10 keys", be.executions())
	}

	// A wrong password for the masters' user: 503s, and not a connection
	// to a master per request.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, m := range c.MasterAddrs() {
		if err := redistest.SetACLUser(ctx, m, nil, "user caddy on >right ~* &* +@all"); err != nil {
			t.Fatal(err)
		}
	}
	h := unitHandler(t, c.MasterAddrs()[0], func(h *Handler) {
		h.Redis.Mode = ModeCluster
		h.Redis.Username, h.Redis.Password = "caddy", "wrong"
	})
	requireFewDials(t, h, c.MasterAddrs()...)
}

func TestSentinelTopology(t *testing.T) {
	t.Parallel()
	s := redistest.StartSentinel(t)
	redisLine := fmt.Sprintf("redis {\n\t\t\tmode sentinel\n\t\t\tmaster_name %s\n\t\t\taddress %s\n\t\t}",
		s.MasterName(), strings.Join(s.SentinelAddrs(), " "))
	st := stormTwoNodes(t, redisLine, 10, 8)
	st.nextFencesIncrease(t)

	// After each failover, new locks are taken on the new master, with no
	// restart of Caddy.
	for _, how := range []string{"SENTINEL FAILOVER", "killing the master"} {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		var newMaster string
		var err error
		if how == "SENTINEL FAILOVER" {
			newMaster, err = s.Failover(ctx)
		} else {
			newMaster, err = s.KillMaster(ctx)
		}
		cancel()
		if err != nil {
			t.Fatalf("%s: %v", how, err)
		}
		key := "after " + how
		redistest.Eventually(t, 30*time.Second, "a lock on the new master after "+how, func() bool {
			r, err := sendRequest(context.Background(), st.client, "POST", st.nodes[1].URL+"/pay", `{}`, "Idempotency-Key", key)
			return err == nil && r.Status == 200 && get(t, newMaster, engine.CounterKey(defaultKey(key))) != ""
		})
		st.nextFencesIncrease(t)
	}

	// A wrong password for the master's user: 503s, and not a connection
	// to the master per request.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	master, err := s.MasterAddr(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := redistest.SetACLUser(ctx, master, nil, "user caddy on >right ~* &* +@all"); err != nil {
		t.Fatal(err)
	}
	h := unitHandler(t, s.SentinelAddrs()[0], func(h *Handler) {
		h.Redis.Mode, h.Redis.MasterName, h.Redis.Addresses = ModeSentinel, s.MasterName(), s.SentinelAddrs()
		h.Redis.Username, h.Redis.Password = "caddy", "wrong"
	})
	requireFewDials(t, h, master)
}

func TestRedlockTopology(t *testing.T) {
	t.Parallel()
	for _, n := range []int{3, 5} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			srvs := make([]*redistest.Server, n)
			addrs := make([]string, n)
			for i := range n {
				srvs[i] = redistest.Start(t)
				addrs[i] = srvs[i].Addr
			}
			// A timeout well above a loaded CI machine's answer times (tens
			// of ms with 2 of 5 paused), so that only an answer that waited
			// for a paused master reaches it.
			const timeout = time.Second
			redisLine := "redis {\n\t\t\tmode redlock\n\t\t\taddress " + strings.Join(addrs, " ") + "\n\t\t\ttimeout " + timeout.String() + "\n\t\t}"
			st := stormTwoNodes(t, redisLine, 10, 8)
			st.nextFencesIncrease(t)

			// A minority that hangs (paused: it accepts and never answers):
			// still locked, and no answer waits for it, as every step
			// returns once a majority answered.
			for i := range n / 2 {
				if err := srvs[i].Pause(); err != nil {
					t.Fatal(err)
				}
			}
			slowest := st.nextFencesIncrease(t)
			t.Logf("slowest answer with %d of %d masters paused: %v", n/2, n, slowest)
			if slowest >= timeout {
				t.Errorf("an answer waited for a paused master: %v, want less than the %v timeout", slowest, timeout)
			}
			for i := range n / 2 {
				if err := srvs[i].Resume(); err != nil {
					t.Fatal(err)
				}
			}

			// A minority stopped: still locked, fencing still increasing.
			for i := range n / 2 {
				srvs[i].Stop()
			}
			st.nextFencesIncrease(t)

			// A majority stopped: 503, fail closed.
			srvs[n/2].Stop()
			r, err := sendRequest(context.Background(), st.client, "POST", st.nodes[0].URL+"/pay", `{}`, "Idempotency-Key", "no-majority")
			if err != nil {
				t.Fatal(err)
			}
			expectProblem(t, r, http.StatusServiceUnavailable)
		})
	}
}
