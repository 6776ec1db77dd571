package main

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

// caddyBin is the Caddy binary both tests run, built once into dir.
var caddyBin struct {
	dir  string
	once sync.Once
	path string
	err  error
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "chaos-test-")
	if err != nil {
		panic(err)
	}
	caddyBin.dir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func buildOnce(t *testing.T) string {
	t.Helper()
	caddyBin.once.Do(func() {
		caddyBin.path, caddyBin.err = buildCaddy(caddyBin.dir)
	})
	if caddyBin.err != nil {
		t.Fatal(caddyBin.err)
	}
	return caddyBin.path
}

func runShort(t *testing.T, lockOnly bool) *outcome {
	t.Helper()
	sc := shortScenario(1)
	sc.LockOnly = lockOnly
	return runOne(t, sc)
}

// runOne runs sc and checks that it ran: executions, and every planned
// fault without an error of its own.
func runOne(t *testing.T, sc scenario) *outcome {
	t.Helper()
	redistest.Require(t)
	lockOnly := sc.LockOnly
	sc.Discard = lockOnly // its violations are expected: no logs to keep
	sc.Bin = buildOnce(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var progress bytes.Buffer
	o, err := runScenario(ctx, sc, &progress)
	if err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	var summary bytes.Buffer
	writeSummary(&summary, o)
	t.Logf("%s%s", progress.String(), summary.String())
	if len(o.Record.Execs) == 0 || len(o.Record.Faults) != len(sc.Kinds)*sc.FaultRounds {
		t.Fatalf("the run did not happen: %d executions, %d faults", len(o.Record.Execs), len(o.Record.Faults))
	}
	for _, f := range o.Record.Faults {
		if f.Err != "" {
			t.Errorf("fault %s: %s", f.Kind, f.Err)
		}
	}
	return o
}

// TestChaosShort is the short chaos run of `make test`: two nodes, one
// fault of each kind, in idempotency mode; every check must pass.
func TestChaosShort(t *testing.T) {
	o := runShort(t, false)
	for _, v := range o.Violations {
		t.Errorf("[%s] key %s: %s", v.Check, v.Key, v.Detail)
	}
	replays := 0
	for _, c := range o.Record.Clients {
		for _, a := range c.Attempts {
			if a.Err == "" && a.Replayed {
				replays++
			}
		}
	}
	if replays == 0 {
		t.Error("no replays: the idempotency block did not take effect")
	}
}

// TestChaosShortAccounts is the short run with the payments on four
// accounts (per-account serialisation, `idempotency { key }`): every check
// must pass, among them that no two requests of an account ran at once;
// and the run must have asked that of the account's lock: different keys
// of an account sent at once, an account with more than one execution,
// and replays.
func TestChaosShortAccounts(t *testing.T) {
	sc := shortScenario(1)
	sc.Accounts = 4
	o := runOne(t, sc)
	for _, v := range o.Violations {
		t.Errorf("[%s] key %s: %s", v.Check, v.Key, v.Detail)
	}
	execs := map[string]int{}
	for _, e := range o.Record.Execs {
		if e.Account == "" {
			t.Fatalf("%s of %s reached the backend without its account", e.ID, e.Key)
		}
		execs[e.Account]++
	}
	if len(execs) != sc.Accounts {
		t.Errorf("executions of %d accounts, want %d: %v", len(execs), sc.Accounts, execs)
	}
	replays, together := 0, 0
	var as []attempt
	for _, c := range o.Record.Clients {
		for _, a := range c.Attempts {
			if a.Err == "" && a.Replayed {
				replays++
			}
			as = append(as, a)
		}
	}
	for _, b := range as {
		for _, a := range as {
			if accountOf(a.Key) == accountOf(b.Key) && a.Key != b.Key && a.Start.Before(b.Start) && b.Start.Before(a.End) {
				together++
				break
			}
		}
	}
	if replays == 0 || together == 0 {
		t.Errorf("%d replays, %d attempts sent while another key of their account was in flight: the run did not test the account's lock", replays, together)
	}
}

// TestOnAccounts: the payments on their accounts, the same idempotency key
// in several accounts, bursts of one account's payments, and the seed's
// payments otherwise as without accounts.
func TestOnAccounts(t *testing.T) {
	const n = 8
	plain := planKeys(rand.New(rand.NewPCG(1, 2)), 400, 40*time.Second, time.Second, nil)
	plans := planKeys(rand.New(rand.NewPCG(1, 2)), 400, 40*time.Second, time.Second, nil)
	onAccounts(1, plans, n, 40*time.Second)
	accounts := map[string]int{}
	seen := map[string]bool{}
	byIdem := map[string]int{}
	bursts := 0
	for i, kp := range plans {
		accounts[kp.Account]++
		byIdem[kp.IdemKey]++
		if kp.Key != kp.Account+"/"+kp.IdemKey || seen[kp.Key] {
			t.Fatalf("plan %d: key %q of account %q, idempotency key %q (twice: %v)", i, kp.Key, kp.Account, kp.IdemKey, seen[kp.Key])
		}
		seen[kp.Key] = true
		if len(kp.Clients) != len(plain[i].Clients) || string(kp.Body) == string(plain[i].Body) || !strings.Contains(string(kp.Body), kp.Key) {
			t.Fatalf("plan %d: %d clients (%d without accounts), body %s", i, len(kp.Clients), len(plain[i].Clients), kp.Body)
		}
		if i > 0 && kp.Account == plans[i-1].Account && kp.At >= plans[i-1].At && kp.At-plans[i-1].At < burstGap {
			bursts++
		}
	}
	if len(accounts) != n || byIdem["pay_00001"] != n || bursts < len(plans)/5 {
		t.Errorf("accounts %v, pay_00001 in %d accounts, %d bursts", accounts, byIdem["pay_00001"], bursts)
	}
}

// TestChaosLockOnlyFails runs the same without the idempotency block: a
// lock alone lets a payment run again after its answer was given, and the
// checks must say so.
func TestChaosLockOnlyFails(t *testing.T) {
	o := runShort(t, true)
	reruns := 0
	for _, v := range o.Violations {
		if v.Check == checkRerun {
			reruns++
		}
	}
	if reruns == 0 {
		t.Fatalf("lock only: no %s violation among %d; the checks cannot tell a lock from idempotency", checkRerun, len(o.Violations))
	}
	if !strings.Contains(o.Violations[0].Detail, "ex_") {
		t.Errorf("a violation's detail names no execution: %q", o.Violations[0].Detail)
	}
}

// TestChaosFailover is `make chaos`'s failover phase (about a minute): the
// nodes on a Sentinel pair with replicas 1, two failovers with the replica
// behind; every check must pass, with no window for the failovers.
func TestChaosFailover(t *testing.T) {
	o := runOne(t, failoverScenario(1))
	for _, v := range o.Violations {
		t.Errorf("[%s] key %s: %s", v.Check, v.Key, v.Detail)
	}
}

// TestChaosCluster is `make chaos`'s cluster phase (about a minute and a
// half): a Cluster of three masters with a replica each and replicas 1,
// masters killed, stopped and failed over by hand, busy slots migrated, a
// master killed with its replica behind; every check must pass, with no
// window for any of them.
func TestChaosCluster(t *testing.T) {
	o := runOne(t, clusterScenario(1))
	for _, v := range o.Violations {
		t.Errorf("[%s] key %s: %s", v.Check, v.Key, v.Detail)
	}
}
