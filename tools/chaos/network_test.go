package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// The network phase's schedule: every kind once, in an order and on nodes
// drawn from the seed, one after the other with a gap, the same for a seed.
func TestPlanNetworkFaults(t *testing.T) {
	sc := networkScenario(1)
	plan := func(seed uint64) []plannedFault {
		rng := rand.New(rand.NewPCG(seed, 1))
		return planNetworkFaults(rng, sc.Kinds, sc.Nodes, sc.TTL, sc.Timeout, sc.FaultStart, sc.MinGap, sc.MaxGap)
	}
	a, b, c := plan(1), plan(1), plan(2)
	if len(a) != len(networkKinds) {
		t.Fatalf("%d faults, want one of each of the %d kinds", len(a), len(networkKinds))
	}
	if !slices.EqualFunc(a, b, func(x, y plannedFault) bool {
		return x.Kind == y.Kind && x.At == y.At && slices.Equal(x.Nodes, y.Nodes)
	}) {
		t.Error("the same seed gave two schedules")
	}
	if slices.EqualFunc(a, c, func(x, y plannedFault) bool { return x.Kind == y.Kind }) {
		t.Error("seeds 1 and 2 gave the same order")
	}
	var kinds []faultKind
	end := time.Duration(0)
	for i, f := range a {
		kinds = append(kinds, f.Kind)
		spec, ok := networkFault(f.Kind, sc.TTL, sc.Timeout)
		if !ok {
			t.Fatalf("%s has no spec", f.Kind)
		}
		if f.For != spec.For {
			t.Errorf("%s: planned for %v, its spec says %v", f.Kind, f.For, spec.For)
		}
		if i == 0 && f.At != sc.FaultStart {
			t.Errorf("the first fault at %v, want %v", f.At, sc.FaultStart)
		}
		if i > 0 && (f.At < end+sc.MinGap || f.At > end+sc.MaxGap) {
			t.Errorf("%s at %v: the one before ended at %v, gap not in [%v, %v]", f.Kind, f.At, end, sc.MinGap, sc.MaxGap)
		}
		end = f.At + f.For
		if !slices.IsSorted(f.Nodes) || len(slices.Compact(slices.Clone(f.Nodes))) != len(f.Nodes) {
			t.Errorf("%s: nodes %v not sorted and distinct", f.Kind, f.Nodes)
		}
		for _, n := range f.Nodes {
			if n < 0 || n >= sc.Nodes {
				t.Errorf("%s: node %d of %d", f.Kind, n, sc.Nodes)
			}
		}
		if spec.Some && (len(f.Nodes) < 1 || len(f.Nodes) >= sc.Nodes) {
			t.Errorf("%s is on some nodes, got %v of %d", f.Kind, f.Nodes, sc.Nodes)
		}
		if !spec.Some && len(f.Nodes) != sc.Nodes {
			t.Errorf("%s is on every node, got %v", f.Kind, f.Nodes)
		}
	}
	slices.Sort(kinds)
	want := slices.Sorted(slices.Values(networkKinds))
	if !slices.Equal(kinds, want) {
		t.Errorf("kinds %v, want %v", kinds, want)
	}
	if end > sc.Spread {
		t.Errorf("the faults end at %v, after the payments' spread %v", end, sc.Spread)
	}
}

// Each fault's toxics say what docs/chaos.md says of them.
func TestNetworkFaults(t *testing.T) {
	ttl, timeout := 2*time.Second, 300*time.Millisecond
	get := func(k faultKind) netFault {
		t.Helper()
		f, ok := networkFault(k, ttl, timeout)
		if !ok {
			t.Fatalf("%s: no spec", k)
		}
		return f
	}
	ms := func(d time.Duration) int64 { return d.Milliseconds() }
	for _, k := range networkKinds {
		f := get(k)
		if f.For <= 0 || len(f.Toxics) == 0 || (f.Link != linkRedis && f.Link != linkBackend) {
			t.Errorf("%s: %+v", k, f)
		}
		names := map[string]bool{}
		for _, tx := range f.Toxics {
			if names[tx.Name] {
				t.Errorf("%s: two toxics named %s", k, tx.Name)
			}
			names[tx.Name] = true
			if tx.Stream != upstream && tx.Stream != downstream || tx.Toxicity <= 0 || tx.Toxicity > 1 {
				t.Errorf("%s: %+v", k, tx)
			}
		}
	}
	if _, ok := networkFault(redisPause, ttl, timeout); ok {
		t.Error("redis-pause is not a network fault")
	}
	// Latency below, around and above the lease, with jitter.
	low, lease, high := get(netRedisLatencyLow).Toxics, get(netRedisLatencyLease).Toxics[0], get(netRedisLatencyHigh).Toxics[0]
	if rtt := low[0].Attributes["latency"] + low[1].Attributes["latency"]; rtt < ms(timeout)/2 || rtt > ms(2*timeout) || low[0].Attributes["jitter"] == 0 {
		t.Errorf("low latency: %v", low)
	}
	if l := lease.Attributes["latency"]; l != ms(ttl) || lease.Attributes["jitter"] == 0 {
		t.Errorf("latency around the lease: %v", lease)
	}
	if l, j := high.Attributes["latency"], high.Attributes["jitter"]; l-j <= ms(ttl) || j == 0 || high.Stream != upstream {
		t.Errorf("latency above the lease: %v", high)
	}
	// The hold delivers at the heal: a latency no fault outlasts.
	for _, tx := range append(get(netRedisHold).Toxics, get(netRedisHoldSome).Toxics...) {
		if tx.Type != "latency" || tx.Attributes["latency"] < ms(time.Minute) {
			t.Errorf("hold: %v", tx)
		}
	}
	if hs := get(netRedisHoldSome); hs.Toxics[0].Toxicity >= 1 || hs.For <= ttl+2*timeout {
		t.Errorf("hold-some must hold some connections' begins past their give-back's mark: %+v", hs)
	}
	if p := get(netRedisPartition); !p.Some || len(p.Toxics) != 2 || p.For <= ttl {
		t.Errorf("partition: %+v", p)
	}
	// A large answer takes longer on the slow link than what is left of a
	// lease after its last renewal (every ttl/3).
	if s := get(netRedisSlow); time.Duration(largeAnswer)*time.Millisecond/time.Duration(s.Toxics[0].Attributes["rate"]) <= ttl*2/3 {
		t.Errorf("the slow link carries a large answer within two thirds of a lease: %+v", s)
	}
	if bl := get(netBackendLatency).Toxics[0]; bl.Attributes["latency"]-bl.Attributes["jitter"] <= ms(ttl) {
		t.Errorf("backend latency not past the lease: %v", bl)
	}
}

// fakeToxiproxy answers as toxiproxy's API does, and records the requests.
type fakeToxiproxy struct {
	mu      sync.Mutex
	toxics  map[string][]toxic
	proxies map[string]toxiProxy
	calls   []string
}

func (f *fakeToxiproxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, r.Method+" "+r.URL.EscapedPath())
	fail := func(status int, msg string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(apiError{Message: msg, Status: status})
	}
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/version":
		_, _ = io.WriteString(w, `{"version": "git"}`+"\n")
	case r.Method == http.MethodPost && r.URL.Path == "/reset":
		f.toxics = map[string][]toxic{}
		w.WriteHeader(http.StatusNoContent)
	case r.Method == http.MethodPost && r.URL.Path == "/proxies":
		var p toxiProxy
		if err := json.NewDecoder(r.Body).Decode(&p); err != nil || p.Name == "" {
			fail(http.StatusBadRequest, "bad request body")
			return
		}
		if _, dup := f.proxies[p.Name]; dup {
			fail(http.StatusConflict, "proxy already exists")
			return
		}
		p.Listen = strings.TrimSuffix(p.Listen, ":0") + ":40001"
		f.proxies[p.Name] = p
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(p)
	case len(parts) == 2 && parts[0] == "proxies" && r.Method == http.MethodGet:
		p, ok := f.proxies[parts[1]]
		if !ok {
			fail(http.StatusNotFound, "proxy not found")
			return
		}
		p.Toxics = f.toxics[p.Name]
		_ = json.NewEncoder(w).Encode(p)
	case len(parts) == 3 && parts[2] == "toxics" && r.Method == http.MethodPost:
		var raw map[string]any
		if err := json.NewDecoder(r.Body).Decode(&raw); err != nil {
			fail(http.StatusBadRequest, "bad request body")
			return
		}
		if _, ok := raw["toxicity"]; !ok {
			fail(http.StatusBadRequest, "the test wants toxicity sent")
			return
		}
		b, _ := json.Marshal(raw)
		var tx toxic
		_ = json.Unmarshal(b, &tx)
		f.toxics[parts[1]] = append(f.toxics[parts[1]], tx)
		_ = json.NewEncoder(w).Encode(tx)
	case len(parts) == 4 && parts[2] == "toxics" && r.Method == http.MethodPatch:
		ts := f.toxics[parts[1]]
		i := slices.IndexFunc(ts, func(t toxic) bool { return t.Name == parts[3] })
		if i < 0 {
			fail(http.StatusNotFound, "toxic not found")
			return
		}
		var body struct {
			Attributes map[string]int64 `json:"attributes"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			fail(http.StatusBadRequest, "bad request body")
			return
		}
		ts[i].Attributes = body.Attributes
		_ = json.NewEncoder(w).Encode(ts[i])
	case len(parts) == 4 && parts[2] == "toxics" && r.Method == http.MethodDelete:
		ts := f.toxics[parts[1]]
		i := slices.IndexFunc(ts, func(t toxic) bool { return t.Name == parts[3] })
		if i < 0 {
			fail(http.StatusNotFound, "toxic not found")
			return
		}
		f.toxics[parts[1]] = slices.Delete(ts, i, i+1)
		w.WriteHeader(http.StatusNoContent)
	default:
		fail(http.StatusNotFound, "no route")
	}
}

func TestToxiClient(t *testing.T) {
	fake := &fakeToxiproxy{toxics: map[string][]toxic{}, proxies: map[string]toxiProxy{}}
	srv := httptest.NewServer(fake)
	defer srv.Close()
	c := newToxiClient(srv.URL)
	ctx := context.Background()

	if v, err := c.version(ctx); err != nil || v != "git" {
		t.Fatalf("version: %q, %v", v, err)
	}
	p, err := c.createProxy(ctx, "redis-0", "127.0.0.1:0", "127.0.0.1:6379")
	if err != nil || p.Listen != "127.0.0.1:40001" || p.Upstream != "127.0.0.1:6379" || !p.Enabled {
		t.Fatalf("createProxy: %+v, %v", p, err)
	}
	if _, err := c.createProxy(ctx, "redis-0", "127.0.0.1:0", "127.0.0.1:6379"); err == nil || !strings.Contains(err.Error(), "proxy already exists") {
		t.Errorf("a second proxy of the same name: %v, want the API's message", err)
	}
	if _, err := c.createProxy(ctx, "open", "0.0.0.0:0", "127.0.0.1:6379"); err == nil {
		t.Error("a proxy on 0.0.0.0 was asked for: only loopback is allowed")
	}
	hs, _ := networkFault(netRedisHoldSome, 2*time.Second, 300*time.Millisecond)
	bh, _ := networkFault(netRedisBlackHole, 2*time.Second, 300*time.Millisecond)
	for _, tx := range append(hs.Toxics, bh.Toxics...) {
		if err := c.addToxic(ctx, "redis-0", tx); err != nil {
			t.Fatal(err)
		}
	}
	got, err := c.proxy(ctx, "redis-0")
	if err != nil || len(got.Toxics) != 3 {
		t.Fatalf("proxy: %+v, %v", got, err)
	}
	if tx := got.Toxics[0]; tx.Type != "latency" || tx.Stream != upstream || tx.Toxicity != 0.5 || tx.Attributes["latency"] != hold.Milliseconds() {
		t.Errorf("the hold as the API got it: %+v", tx)
	}
	if err := c.removeToxic(ctx, "redis-0", "timeout-downstream"); err != nil {
		t.Fatal(err)
	}
	if err := c.removeToxic(ctx, "redis-0", "timeout-downstream"); err == nil || !strings.Contains(err.Error(), "toxic not found") {
		t.Errorf("removing it again: %v", err)
	}
	if err := c.reset(ctx); err != nil {
		t.Fatal(err)
	}
	if got, _ := c.proxy(ctx, "redis-0"); len(got.Toxics) != 0 {
		t.Errorf("toxics after a reset: %v", got.Toxics)
	}
	if got := hs.Toxics[0].String(); got != "latency upstream (jitter 0, latency 3600000) toxicity 0.5" {
		t.Errorf("String: %q", got)
	}
}

// heal removes each proxy's toxics in the reverse order of their adding.
func TestNetworkApplyHeal(t *testing.T) {
	fake := &fakeToxiproxy{toxics: map[string][]toxic{}, proxies: map[string]toxiProxy{}}
	srv := httptest.NewServer(fake)
	defer srv.Close()
	n := &network{tp: &toxiproxyServer{toxiClient: newToxiClient(srv.URL)}}
	for i := range 3 {
		fake.proxies[proxyName(linkRedis, i)] = toxiProxy{Name: proxyName(linkRedis, i)}
	}
	spec, _ := networkFault(netRedisHold, 2*time.Second, 300*time.Millisecond)
	added, err := n.apply(context.Background(), linkRedis, []int{0, 2}, spec.Toxics)
	if err != nil || len(added) != 4 {
		t.Fatalf("apply: %v, %v", added, err)
	}
	if len(fake.toxics["redis-1"]) != 0 || len(fake.toxics["redis-0"]) != 2 {
		t.Errorf("toxics: %v", fake.toxics)
	}
	fake.calls = nil
	if err := n.heal(added); err != nil {
		t.Fatal(err)
	}
	var calls0 []string
	for _, c := range fake.calls {
		if strings.Contains(c, " /proxies/redis-0/") {
			calls0 = append(calls0, c)
		}
	}
	// Made neutral, then removed, downstream first.
	if want := []string{"PATCH /proxies/redis-0/toxics/latency-downstream", "PATCH /proxies/redis-0/toxics/latency-upstream",
		"DELETE /proxies/redis-0/toxics/latency-downstream", "DELETE /proxies/redis-0/toxics/latency-upstream"}; !slices.Equal(calls0, want) {
		t.Errorf("heal of redis-0: %v, want %v", calls0, want)
	}
	if len(fake.toxics["redis-0"])+len(fake.toxics["redis-2"]) != 0 {
		t.Errorf("left after the heal: %v", fake.toxics)
	}
	// A toxic the API refuses: the others are healed, and every toxic removed.
	added, err = n.apply(context.Background(), linkRedis, []int{1}, []toxic{{Name: "x", Type: "latency", Stream: upstream, Toxicity: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.heal(append(added, placed{proxy: "redis-1", toxic: toxic{Name: "gone"}})); err == nil {
		t.Error("a removal that failed was not reported")
	}
	if len(fake.toxics["redis-1"]) != 0 {
		t.Errorf("left after a failed heal: %v", fake.toxics)
	}
}

func TestCheckToxiproxyRefusesAnotherBinary(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Skip(err)
	}
	if err := checkToxiproxy(self); err == nil {
		t.Error("the test binary passed for toxiproxy-server " + toxiproxyVersion)
	}
	if err := checkToxiproxy(self + ".missing"); err == nil {
		t.Error("a missing file passed")
	}
}

// realToxiproxy runs the real toxiproxy (installed into the cache as make
// chaos does; the test is skipped when that fails, e.g. offline) and an
// echo server, which sends back what it reads twice, 10ms apart, in two
// writes, and a proxy to it.
func realToxiproxy(t *testing.T) (*toxiproxyServer, toxiProxy) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts toxiproxy")
	}
	var progress strings.Builder
	bin, err := installToxiproxy(&progress)
	if err != nil {
		t.Skipf("toxiproxy could not be installed: %v", err)
	}
	if progress.Len() > 0 {
		t.Log(progress.String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tp, err := startToxiproxy(ctx, bin, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tp.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				rd := bufio.NewReader(c)
				for {
					line, err := rd.ReadString('\n')
					if err != nil {
						return
					}
					_, _ = io.WriteString(c, line)
					time.Sleep(10 * time.Millisecond)
					_, _ = io.WriteString(c, line)
				}
			}()
		}
	}()
	p, err := tp.createProxy(ctx, "echo", "127.0.0.1:0", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	return tp, p
}

// TestToxiproxyHoldAndBlackHole shows on the real toxiproxy what the phase
// relies on: a latency toxic of an hour holds what comes in and its heal
// delivers all of it at once; a timeout toxic of 0 drops what comes in and
// its removal closes the connection.
func TestToxiproxyHoldAndBlackHole(t *testing.T) {
	tp, p := realToxiproxy(t)
	ctx := context.Background()
	conn, err := net.Dial("tcp", p.Listen)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rd := bufio.NewReader(conn)
	read := func(want string, within time.Duration) error {
		_ = conn.SetReadDeadline(time.Now().Add(within))
		got, err := rd.ReadString('\n')
		if err == nil && got != want+"\n" {
			t.Errorf("read %q, want %q", got, want)
		}
		return err
	}
	if _, err := io.WriteString(conn, "before\n"); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := read("before", time.Second); err != nil {
			t.Fatal(err)
		}
	}

	n := &network{tp: tp}
	apply := func(kind faultKind) []placed {
		spec, _ := networkFault(kind, time.Second, 100*time.Millisecond)
		var added []placed
		for _, tx := range spec.Toxics {
			if err := tp.addToxic(ctx, p.Name, tx); err != nil {
				t.Fatal(err)
			}
			added = append(added, placed{proxy: p.Name, toxic: tx})
		}
		return added
	}
	added := apply(netRedisHold)
	if _, err := io.WriteString(conn, "held\n"); err != nil {
		t.Fatal(err)
	}
	if err := read("", 500*time.Millisecond); err == nil {
		t.Fatal("the hold let a line through")
	}
	healed := time.Now()
	if err := n.heal(added); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := read("held", time.Second); err != nil {
			t.Fatalf("after the heal: %v", err)
		}
	}
	t.Logf("held lines delivered %v after the heal began", time.Since(healed).Round(time.Millisecond))

	added = apply(netRedisBlackHole)
	if _, err := io.WriteString(conn, "dropped\n"); err != nil {
		t.Fatal(err)
	}
	if err := read("", 300*time.Millisecond); err == nil {
		t.Fatal("the black hole let a line through")
	}
	if err := n.heal(added); err != nil {
		t.Fatal(err)
	}
	if err := read("", time.Second); err == nil {
		t.Fatal("after the black hole's heal the connection gave a line; want it closed")
	}
	c2, err := net.Dial("tcp", p.Listen)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if _, err := io.WriteString(c2, "after\n"); err != nil {
		t.Fatal(err)
	}
	_ = c2.SetReadDeadline(time.Now().Add(time.Second))
	if got, err := bufio.NewReader(c2).ReadString('\n'); err != nil || got != "after\n" {
		t.Fatalf("a new connection after the heal: %q, %v", got, err)
	}
}

// TestToxiproxyHeal: connections whose client left while a downstream
// latency toxic held their answers (as Caddy leaves one at its
// response_header_timeout, go-redis one at its timeout) made toxiproxy's
// removal of the toxic wait 5s per piece of held data, 25s and more
// (toxiproxy's API then answered 503), with no new connection let through
// meanwhile; heal makes the toxic neutral first, and is quick.
func TestToxiproxyHeal(t *testing.T) {
	tp, p := realToxiproxy(t)
	ctx := context.Background()
	tx := toxic{Name: "latency-downstream", Type: "latency", Stream: downstream, Toxicity: 1, Attributes: map[string]int64{"latency": 3000}}
	if err := tp.addToxic(ctx, p.Name, tx); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		c, err := net.Dial("tcp", p.Listen)
		if err != nil {
			t.Fatal(err)
		}
		for j := range 4 {
			fmt.Fprintf(c, "line %d\n", j)
			time.Sleep(20 * time.Millisecond)
		}
		c.Close() // with its answers held
	}
	time.Sleep(200 * time.Millisecond)
	began := time.Now()
	if err := (&network{tp: tp}).heal([]placed{{proxy: p.Name, toxic: tx}}); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(began); took > 2*time.Second {
		t.Errorf("the heal took %v", took)
	} else {
		t.Logf("the heal took %v", took.Round(time.Millisecond))
	}
	got, err := tp.proxy(ctx, p.Name)
	if err != nil || len(got.Toxics) != 0 {
		t.Errorf("after the heal: %+v, %v", got, err)
	}
}

func TestLargeShare(t *testing.T) {
	plan := []plannedFault{{Kind: netRedisHold, At: 10 * time.Second, For: 3 * time.Second},
		{Kind: netRedisSlow, At: 20 * time.Second, For: 6 * time.Second}}
	share := largeShare(plan, 2*time.Second, 0.1, 0.6)
	for at, want := range map[time.Duration]float64{
		0: 0.1, 11 * time.Second: 0.1, 17900 * time.Millisecond: 0.1, 18 * time.Second: 0.6,
		20 * time.Second: 0.6, 25900 * time.Millisecond: 0.6, 26 * time.Second: 0.1,
	} {
		if got := share(at); got != want {
			t.Errorf("at %v: %v, want %v", at, got, want)
		}
	}
	// The other phases draw nothing more: their plans stay as they were.
	a := planKeys(rand.New(rand.NewPCG(1, 2)), 50, 10*time.Second, 2*time.Second, nil)
	b := planKeys(rand.New(rand.NewPCG(1, 2)), 50, 10*time.Second, 2*time.Second, nil)
	for i := range a {
		if a[i].At != b[i].At || a[i].Path != chargePath || len(a[i].Clients) != len(b[i].Clients) {
			t.Fatalf("payment %d: %+v and %+v", i, a[i], b[i])
		}
	}
	c := planKeys(rand.New(rand.NewPCG(1, 2)), 200, 10*time.Second, 2*time.Second, func(time.Duration) float64 { return 0.5 })
	large := 0
	for _, kp := range c {
		if kp.Path == largeChargePath {
			large++
		}
	}
	if large < 60 || large > 140 {
		t.Errorf("%d of 200 payments large at a share of 0.5", large)
	}
}

// -faults and -rounds narrow a phase to the faults named, each that many
// times, and refuse a fault that is not the phase's.
func TestScenarioOnly(t *testing.T) {
	sc := networkScenario(1)
	if err := sc.only("redis-latency-lease,redis-hold", 3); err != nil {
		t.Fatal(err)
	}
	if len(sc.Kinds) != 6 || sc.Kinds[0] != netRedisLatencyLease || sc.Kinds[1] != netRedisHold {
		t.Fatalf("network phase narrowed to %v, want redis-latency-lease and redis-hold three times", sc.Kinds)
	}
	full := fullScenario(1)
	if err := full.only("redis-pause", 4); err != nil || len(full.Kinds) != 1 || full.FaultRounds != 4 {
		t.Fatalf("full phase narrowed: %v %v rounds %d, want redis-pause 4 times", err, full.Kinds, full.FaultRounds)
	}
	if err := full.only("redis-latency-lease", 0); err == nil {
		t.Fatal("a network fault accepted in the full phase")
	}
}
