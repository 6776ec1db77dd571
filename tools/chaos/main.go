// Command chaos is the project's chaos test (`make chaos`): several Caddy
// nodes with redis_lock in idempotency mode, each its own process, in front
// of one Redis with an fsynced append-only file and a payment backend that
// records every execution; clients that retry as payment SDKs do; faults on
// a schedule drawn from a seed (Redis paused, killed and restarted from its
// AOF, restarted empty; a node SIGKILLed mid-request; config reloads). The
// records are then checked: no key runs again once its answer was given,
// outside the documented windows; replays are the bytes of the execution
// they name; executions of a key never overlap and their fencing tokens
// increase; every client gets a definite answer in bounded time; nothing in
// progress is left in Redis. It prints a summary and exits 1 on any
// violation. SEED=n changes the schedule; LOCK_ONLY=1 drops the idempotency
// block, which must make it fail; ACCOUNTS=n puts the payments on n
// accounts, the route in per-account serialisation (`idempotency { key }`),
// and checks that no two requests of an account ever ran at once. Its phases: the full scenario, the
// failover phase on a Sentinel pair, the network phase, with toxiproxy
// (installed with go install, see toxiproxy.go) between each node and Redis
// and the backend (network.go), and the cluster phase on a Redis Cluster
// of six nodes (cluster.go).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// scenario is what a run does.
type scenario struct {
	Name        string
	Seed        uint64
	LockOnly    bool
	Accounts    int         // the payments on this many accounts, one request of an account at a time (idempotency { key }); 0: none
	Failover    bool        // Redis is a Sentinel-managed pair with replicas 1; the faults are failoverKinds
	Cluster     bool        // Redis is a Cluster of 3 masters with a replica each, replicas 1; the faults are clusterKinds
	Network     bool        // toxiproxy between the nodes and Redis and the backend; the faults are networkKinds
	Large       float64     // the share of payments whose answer is large (largeAnswer bytes)
	LargeSlow   float64     // the same for payments that start around a slow link (network phase)
	Kinds       []faultKind // the faults, each FaultRounds times
	Nodes       int
	TTL         time.Duration
	Timeout     time.Duration // Redis command timeout in the nodes
	Keys        int
	Spread      time.Duration // the payments start over this long
	FaultRounds int
	FaultStart  time.Duration
	MinGap      time.Duration
	MaxGap      time.Duration
	Bin         string // a Caddy binary with the plugin; empty: build one
	Keep        bool   // keep the work directory (logs, Redis data)
	Scrape      string // write node 0's /metrics, scraped twice a second, and the faults, to this file
	Discard     bool   // remove it even after a violation (kept by default then)
	Monitor     bool   // write Redis's MONITOR to the work directory (kept then)
}

// fullScenario is `make chaos`: about two minutes, twelve faults.
func fullScenario(seed uint64) scenario {
	return scenario{Name: "full", Seed: seed, Nodes: 3, TTL: 2 * time.Second, Timeout: 300 * time.Millisecond,
		Keys: 900, Spread: 95 * time.Second, Kinds: faultKinds, FaultRounds: 2, FaultStart: 4 * time.Second,
		MinGap: 5 * time.Second, MaxGap: 8 * time.Second}
}

// failoverScenario is `make chaos`'s second phase: the nodes on a Sentinel
// pair with `replicas 1`, two failovers with the replica behind, a node
// killed and a reload; about a minute.
func failoverScenario(seed uint64) scenario {
	return scenario{Name: "failover", Seed: seed, Failover: true, Nodes: 3, TTL: 2 * time.Second, Timeout: 300 * time.Millisecond,
		Keys: 400, Spread: 45 * time.Second, Kinds: failoverKinds,
		FaultRounds: 1, FaultStart: 4 * time.Second, MinGap: 4 * time.Second, MaxGap: 6 * time.Second}
}

// networkScenario is `make chaos`'s third phase: toxiproxy between each
// node and Redis and between each node and the backend, and faults on those
// links (latency, black holes, holds, a partial partition, resets, a slow
// link), each once; about two minutes.
func networkScenario(seed uint64) scenario {
	return scenario{Name: "network", Seed: seed, Network: true, Nodes: 3, TTL: 2 * time.Second, Timeout: 300 * time.Millisecond,
		Keys: 800, Spread: 90 * time.Second, Kinds: networkKinds, FaultRounds: 1, FaultStart: 4 * time.Second,
		MinGap: 2 * time.Second, MaxGap: 3500 * time.Millisecond, Large: 0.1, LargeSlow: 0.3}
}

// shortScenario runs in `make test`: seconds, one fault of each kind.
func shortScenario(seed uint64) scenario {
	return scenario{Name: "short", Seed: seed, Nodes: 2, TTL: time.Second, Timeout: 200 * time.Millisecond,
		Keys: 90, Spread: 10 * time.Second, Kinds: faultKinds, FaultRounds: 1, FaultStart: time.Second,
		MinGap: 1500 * time.Millisecond, MaxGap: 2 * time.Second}
}

// outcome is a run's records and verdict.
type outcome struct {
	Scenario   scenario
	Record     runRecord
	Violations []violation
	Excused    excusals  // what the documented windows excused
	Phantoms   *phantoms // with -monitor and no accounts
	Dir        string
	Took       time.Duration
}

func main() {
	seed := uint64(1)
	if s := os.Getenv("SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			fmt.Fprintln(os.Stderr, "chaos: SEED must be a non-negative integer:", s)
			os.Exit(2)
		}
		seed = n
	}
	short := flag.Bool("short", false, "the short scenario of `make test` instead of the full one")
	phase := flag.String("phase", "all", "all: the full scenario, the failover phase, the network phase, then the cluster phase; full; failover; network; cluster")
	lockOnly := flag.Bool("lock-only", os.Getenv("LOCK_ONLY") == "1", "no idempotency block (LOCK_ONLY=1): the checks must fail")
	accounts := 0
	if s := os.Getenv("ACCOUNTS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			fmt.Fprintln(os.Stderr, "chaos: ACCOUNTS must be a non-negative integer:", s)
			os.Exit(2)
		}
		accounts = n
	}
	flag.IntVar(&accounts, "accounts", accounts, "put the payments on this many accounts (ACCOUNTS; 8 is the documented run): the route keyed by X-Account with idempotency { key {http.request.header.Idempotency-Key} } and a wait; 0: none")
	keep := flag.Bool("keep", false, "keep the work directory (node logs, Redis data, records.json)")
	scrapeTo := flag.String("scrape", "", "write node 0's /metrics, scraped twice a second, and the faults to this file (a phase's name is added before the extension); go run ./metricsplot (in tools/) draws them")
	flag.Uint64Var(&seed, "seed", seed, "the schedule's seed (SEED)")
	only := flag.String("faults", "", "only these faults of the phase, comma-separated (say redis-latency-lease), to reproduce one")
	rounds := flag.Int("rounds", 0, "each fault this many times (0: the phase's own count)")
	monitor := flag.Bool("monitor", false, "write every command Redis runs (MONITOR) to redis-monitor.log in the work directory, and keep it")
	flag.Parse()
	if accounts < 0 {
		fmt.Fprintln(os.Stderr, "chaos: -accounts must not be negative")
		os.Exit(2)
	}
	var scs []scenario
	switch {
	case *short:
		scs = []scenario{shortScenario(seed)}
	case *phase == "full":
		scs = []scenario{fullScenario(seed)}
	case *phase == "failover":
		scs = []scenario{failoverScenario(seed)}
	case *phase == "network":
		scs = []scenario{networkScenario(seed)}
	case *phase == "cluster":
		scs = []scenario{clusterScenario(seed)}
	case *phase == "all":
		scs = []scenario{fullScenario(seed), failoverScenario(seed), networkScenario(seed), clusterScenario(seed)}
	default:
		fmt.Fprintln(os.Stderr, "chaos: -phase is all, full, failover, network or cluster, not", *phase)
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	failed := false
	for i := range scs {
		if err := scs[i].only(*only, *rounds); err != nil {
			fmt.Fprintln(os.Stderr, "chaos:", err)
			os.Exit(2)
		}
	}
	for _, sc := range scs {
		sc.LockOnly, sc.Keep, sc.Accounts, sc.Monitor = *lockOnly, *keep || *monitor, accounts, *monitor
		if *scrapeTo != "" {
			ext := filepath.Ext(*scrapeTo)
			sc.Scrape = strings.TrimSuffix(*scrapeTo, ext) + "-" + sc.Name + ext
		}
		o, err := runScenario(ctx, sc, os.Stdout)
		if err != nil {
			fmt.Fprintln(os.Stderr, "chaos:", err)
			os.Exit(2)
		}
		writeSummary(os.Stdout, o)
		failed = failed || len(o.Violations) > 0
	}
	if failed {
		os.Exit(1)
	}
}

// runScenario starts Redis, the backend and the nodes, runs the traffic and
// the faults, and checks the records. Every process it started is stopped
// before it returns.
func runScenario(ctx context.Context, sc scenario, progress io.Writer) (*outcome, error) {
	began := time.Now()
	dir, err := os.MkdirTemp("", "chaos-")
	if err != nil {
		return nil, err
	}
	o := &outcome{Scenario: sc, Dir: dir}
	defer func() {
		if sc.Discard || (!sc.Keep && len(o.Violations) == 0) {
			os.RemoveAll(dir)
		}
	}()
	bin := sc.Bin
	if bin == "" {
		if bin, err = buildCaddy(dir); err != nil {
			return nil, err
		}
	}
	var rds *chaosRedis
	var sen *chaosSentinel
	var cl *chaosCluster
	stopMonitor, monitored := func() {}, false
	cfg := nodeConfig{TTL: sc.TTL, Timeout: sc.Timeout, LockOnly: sc.LockOnly}
	if sc.Accounts > 0 {
		// An account's requests wait for each other (a lease's half, about
		// the longest execution), so that most get through.
		cfg.Accounts, cfg.Wait = true, accountWait(sc.TTL)
	}
	redisDesc := ""
	switch {
	case sc.Cluster:
		if cl, err = startCluster(); err != nil {
			return nil, err
		}
		defer cl.Close()
		cfg.RedisLines = cl.redisLines()
		redisDesc = "a Redis Cluster of 3 masters with a replica each, replicas 1"
	case sc.Failover:
		if sen, err = startSentinel(); err != nil {
			return nil, err
		}
		defer sen.Close()
		cfg.RedisLines = sen.redisLines()
		redisDesc = "a Sentinel-managed master and replica with AOF (appendfsync always), replicas 1"
	default:
		if rds, err = startRedis(dir); err != nil {
			return nil, err
		}
		defer rds.Close()
		cfg.Redis = rds.Addr
		redisDesc = "Redis " + rds.Addr + " with AOF (appendfsync always)"
		if sc.Monitor {
			if stopMonitor, err = monitorRedis(ctx, dir, rds.Addr); err != nil {
				return nil, err
			}
			defer stopMonitor()
			monitored = true
		}
	}
	be, err := startBackend(sc.Seed, sc.TTL)
	if err != nil {
		return nil, err
	}
	defer be.Close()
	cfg.Backend = be.Addr
	var nw *network
	var links func(i int, c *nodeConfig)
	if sc.Network {
		if rds == nil {
			return nil, fmt.Errorf("the network phase runs on one Redis, not on Sentinels")
		}
		if nw, err = startNetwork(ctx, dir, sc.Nodes, rds.Addr, be.Addr, progress); err != nil {
			return nil, err
		}
		defer nw.Close()
		links = func(i int, c *nodeConfig) { c.Redis, c.Backend = nw.redis[i], nw.backend[i] }
		redisDesc += ", each node through toxiproxy " + toxiproxyVersion + " to it and to the backend"
	}
	nodes, err := startNodes(bin, dir, sc.Nodes, cfg, links)
	if err != nil {
		return nil, err
	}
	defer stopNodes(nodes)
	urls := make([]string, len(nodes))
	for i, n := range nodes {
		urls[i] = n.URL()
	}

	rng := rand.New(rand.NewPCG(sc.Seed, 0x6368616f73)) // "chaos"
	var plans []keyPlan
	var schedule []plannedFault
	if sc.Network {
		// The faults first: the payments around the slow link ask for
		// large answers more often.
		schedule = planNetworkFaults(rng, sc.Kinds, sc.Nodes, sc.TTL, sc.Timeout, sc.FaultStart, sc.MinGap, sc.MaxGap)
		plans = planKeys(rng, sc.Keys, sc.Spread, sc.TTL, largeShare(schedule, sc.TTL, sc.Large, sc.LargeSlow))
	} else {
		plans = planKeys(rng, sc.Keys, sc.Spread, sc.TTL, nil)
		schedule = planFaults(rng, sc.Kinds, sc.FaultRounds, sc.Nodes, sc.FaultStart, sc.MinGap, sc.MaxGap)
	}
	mode := "idempotency"
	if sc.LockOnly {
		mode = "lock only (no idempotency block)"
	}
	if sc.Accounts > 0 {
		onAccounts(sc.Seed, plans, sc.Accounts, sc.Spread)
		mode += fmt.Sprintf(", %d accounts (the lock keyed by %s, idempotency { key } by %s, wait %v)",
			sc.Accounts, accountHeader, idempotencyHeader, cfg.Wait)
		if sc.LockOnly {
			mode = fmt.Sprintf("lock only (no idempotency block), keyed by %s on %d accounts, wait %v", accountHeader, sc.Accounts, cfg.Wait)
		}
	}
	fmt.Fprintf(progress, "chaos: %s scenario, seed %d, %s: %d Caddy nodes, %s, ttl %v, %d payments over %v, %d faults; work dir %s\n",
		sc.Name, sc.Seed, mode, sc.Nodes, redisDesc, sc.TTL, sc.Keys, sc.Spread, len(schedule), dir)

	t0 := time.Now().Add(200 * time.Millisecond)
	var scraped chan error
	stopScrape := make(chan struct{})
	if sc.Scrape != "" {
		scraped = make(chan error, 1)
		go func() { scraped <- scrapeMetrics(sc.Scrape, nodes[0].cfg.Admin, t0, stopScrape) }()
	}
	in := &injector{redis: rds, sentinel: sen, cluster: cl, slots: keySlots(plans), net: nw, nodes: nodes, backend: be, ttl: sc.TTL, timeout: sc.Timeout}
	faultsDone := make(chan []faultEvent, 1)
	go func() { faultsDone <- in.run(ctx, t0, schedule) }()
	results := newTraffic(sc.Seed, urls).run(ctx, t0, plans)
	faults := <-faultsDone
	if scraped != nil {
		close(stopScrape)
		if err := <-scraped; err != nil {
			return o, err
		}
		if err := appendFaults(sc.Scrape, t0, faults); err != nil {
			return o, err
		}
	}
	if err := ctx.Err(); err != nil {
		return o, err
	}

	// Quiet: no execution in flight, a killed node's locks expired (a
	// lease), answers given while Redis was away stored (a second).
	var lastKill, lastReturn time.Time
	for _, f := range faults {
		if f.Kind == nodeKill {
			lastKill = f.Start
		} else if f.Kind != nodeReload {
			lastReturn = f.Return
		}
	}
	quiet := time.Now().Add(10 * time.Second)
	for be.busy(-1) > 0 && time.Now().Before(quiet) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(max(time.Until(lastKill.Add(sc.TTL+500*time.Millisecond)), time.Until(lastReturn.Add(time.Second)), 0))
	if cfg.Accounts || sc.LockOnly {
		// A lock (the account's) whose request's outcome is unknown is left
		// to its lease (reference.md): the last request sent upstream, at
		// the latest a wait after its attempt began (the client may have
		// left), may be given up response_header_timeout later.
		var lastSent time.Time
		for _, e := range be.executions() {
			lastSent = maxTime(lastSent, e.Start)
		}
		for _, c := range results {
			for _, a := range c.Attempts {
				lastSent = maxTime(lastSent, a.Start.Add(cfg.Wait))
			}
		}
		time.Sleep(max(time.Until(lastSent.Add(cfg.responseHeaderTimeout()+sc.TTL+500*time.Millisecond)), 0))
	}
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	addr := ""
	switch {
	case cl != nil:
	case sen != nil:
		addr, err = sen.WaitStable(sctx)
	default:
		addr = rds.Addr
	}
	end := redisState{Err: fmt.Sprint(err)}
	switch {
	case cl != nil:
		end = cl.scan(sctx)
	case err == nil:
		end = scanRedis(sctx, addr)
	}
	cancel()

	o.Record = runRecord{Execs: be.executions(), Clients: results, Faults: faults,
		TTL: sc.TTL, Timeout: sc.Timeout, Idempotency: !sc.LockOnly, Wait: cfg.Wait, End: end}
	o.Violations, o.Excused = check(o.Record)
	if monitored && sc.Accounts == 0 {
		stopMonitor()
		p, err := findPhantoms(dir, o.Record.Execs, sc.TTL)
		if err != nil {
			return o, err
		}
		o.Phantoms = &p
	}
	if !sc.Discard && (sc.Keep || len(o.Violations) > 0) {
		if err := writeRecords(filepath.Join(dir, "records.json"), o.Record); err != nil {
			return o, err
		}
	}
	o.Took = time.Since(began)
	return o, nil
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// accountWait is the route's wait in an accounts run: half a lease, about
// the longest execution (maxBackendDelay).
func accountWait(ttl time.Duration) time.Duration { return ttl / 2 }

// writeSummary prints the run: requests, executions, replays, faults,
// violations (each, up to a limit).
func writeSummary(w io.Writer, o *outcome) {
	rec := o.Record
	t0 := time.Time{}
	attempts, errs, replays, timeouts := 0, 0, 0, 0
	statuses := map[int]int{}
	for _, c := range rec.Clients {
		for _, a := range c.Attempts {
			if t0.IsZero() || a.Start.Before(t0) {
				t0 = a.Start
			}
			attempts++
			switch {
			case a.Err == "timeout":
				timeouts++
			case a.Err != "":
				errs++
			default:
				statuses[a.Status]++
			}
			if a.Err == "" && a.Replayed {
				replays++
			}
		}
	}
	dropped, notProc, large := 0, 0, 0
	keys := map[string]int{}
	charges := map[string]int{} // executions that did not answer 503 (not processed), per key
	for _, e := range rec.Execs {
		keys[e.Key]++
		if e.Body == nil || !notProcessed(e.Status) {
			charges[e.Key]++
		}
		if e.Large {
			large++
		}
		if e.Body == nil {
			dropped++
		} else if notProcessed(e.Status) {
			notProc++
		}
	}
	again, charged, twice := 0, 0, 0
	for _, n := range keys {
		again += n - 1
	}
	for _, n := range charges {
		charged += n
		if n > 1 {
			twice++
		}
	}
	codes := make([]int, 0, len(statuses))
	for c := range statuses {
		codes = append(codes, c)
	}
	sort.Ints(codes)
	var st []string
	for _, c := range codes {
		st = append(st, fmt.Sprintf("%d x%d", c, statuses[c]))
	}
	fmt.Fprintln(w, "faults:")
	kinds := map[faultKind]int{}
	for _, f := range rec.Faults {
		kinds[f.Kind]++
		errText := ""
		if f.Err != "" {
			errText = " ERROR: " + f.Err
		}
		fmt.Fprintf(w, "  +%6.2fs %-23s %s; %s%s\n", f.Start.Sub(t0).Seconds(), f.Kind, f.Detail, refusedDuring(rec, f), errText)
	}
	var fk []string
	for _, k := range slices.Compact(slices.Sorted(slices.Values(o.Scenario.Kinds))) {
		fk = append(fk, fmt.Sprintf("%s %d", k, kinds[k]))
	}
	mode := "idempotency"
	if o.Scenario.LockOnly {
		mode = "lock-only"
	}
	if o.Scenario.Accounts > 0 {
		mode += fmt.Sprintf(", %d accounts", o.Scenario.Accounts)
	}
	fmt.Fprintf(w, "summary (seed %d, %s, %s scenario, %v):\n", o.Scenario.Seed, mode, o.Scenario.Name, o.Took.Round(time.Second))
	fmt.Fprintf(w, "  requests:   %d attempts by %d clients for %d payments (%s; %d timeouts, %d connection errors)\n",
		attempts, len(rec.Clients), o.Scenario.Keys, strings.Join(st, ", "), timeouts, errs)
	largeText := ""
	if large > 0 {
		largeText = fmt.Sprintf(", %d with a large answer", large)
	}
	fmt.Fprintf(w, "  executions: %d for %d keys (%d keys ran more than once, %d answers dropped by the backend, %d answered 503%s)\n",
		len(rec.Execs), len(keys), again, dropped, notProc, largeText)
	fmt.Fprintf(w, "  charges:    %d (executions not answered 503), %d keys charged more than once\n", charged, twice)
	if o.Scenario.Accounts > 0 {
		writeAccounts(w, rec, o.Excused.Counts[whyAccountEmpty])
	}
	fmt.Fprintf(w, "  replays:    %d\n", replays)
	fmt.Fprintf(w, "  faults:     %d (%s)\n", len(rec.Faults), strings.Join(fk, ", "))
	fmt.Fprintf(w, "  redis end:  %d locks, %d in-progress records, %d abandoned records, %d completed records, %d fencing counters, %d give-back marks\n",
		len(rec.End.Locks), len(rec.End.InProgress), len(rec.End.Abandoned), len(rec.End.Records), rec.End.Counters, rec.End.GoneMarks)
	if o.Phantoms != nil {
		p := o.Phantoms
		fmt.Fprintf(w, "  phantoms:   %d locks taken, %d by begins whose request never ran; %d of those held over half a lease, %d never given back (Redis's MONITOR)\n",
			p.Taken, p.NeverRan, p.Long, p.NotGivenBack)
	}
	var ex []string
	for why, n := range o.Excused.Counts {
		ex = append(ex, fmt.Sprintf("%d %s", n, why))
	}
	sort.Strings(ex)
	if len(ex) == 0 {
		ex = []string{"nothing"}
	}
	fmt.Fprintf(w, "  windows:    excused %s\n", strings.Join(ex, ", "))
	for _, d := range o.Excused.Details {
		fmt.Fprintf(w, "    %s\n", d)
	}
	byCheck := map[string]int{}
	for _, v := range o.Violations {
		byCheck[v.Check]++
	}
	var vc []string
	for _, c := range []string{checkReplayBytes, checkReplayLast, checkOverlap, checkAccount, checkFencing, checkKeyReused, checkRerun, checkDeath, checkBounded, checkLeftovers} {
		vc = append(vc, fmt.Sprintf("%s %d", c, byCheck[c]))
	}
	fmt.Fprintf(w, "  violations: %d (%s)\n", len(o.Violations), strings.Join(vc, ", "))
	const limit = 40
	for i, v := range o.Violations {
		if i == limit {
			fmt.Fprintf(w, "    ... and %d more\n", len(o.Violations)-limit)
			break
		}
		fmt.Fprintf(w, "    [%s] key %s: %s\n", v.Check, v.Key, v.Detail)
	}
	if sc := o.Scenario; sc.Keep || (len(o.Violations) > 0 && !sc.Discard) {
		fmt.Fprintf(w, "  node logs, Redis data and the records (records.json) kept in %s\n", o.Dir)
	}
}

// writeAccounts prints an accounts run's line: its accounts and keys, the
// executions of an account at once (overlaps, and those a window excused),
// how often clients sent different keys of one account at once, and the
// 409s of a busy account and of a duplicate in progress.
func writeAccounts(w io.Writer, rec runRecord, excused int) {
	keys := map[string]map[string]bool{}
	execs := map[string]int{}
	overlaps, maxAtOnce := 0, 0
	for _, e := range rec.Execs {
		execs[e.Account]++
		overlaps += len(e.Concurrent)
		maxAtOnce = max(maxAtOnce, len(e.Concurrent)+1)
	}
	byAccount := map[string][]attempt{}
	conflicts, inProgress := 0, 0
	for _, c := range rec.Clients {
		acct := accountOf(c.Key)
		if keys[acct] == nil {
			keys[acct] = map[string]bool{}
		}
		keys[acct][c.Key] = true
		byAccount[acct] = append(byAccount[acct], c.Attempts...)
		for _, a := range c.Attempts {
			switch {
			case a.Status == 409 && a.Problem == "conflict":
				conflicts++
			case a.Status == 409 && a.Problem == "in-progress":
				inProgress++
			}
		}
	}
	// Attempts that began while an attempt of another key of their
	// account was in progress: what the account's lock had to serialise.
	together := 0
	for _, as := range byAccount {
		sort.Slice(as, func(i, j int) bool { return as[i].Start.Before(as[j].Start) })
		for j, b := range as {
			for i := j - 1; i >= 0; i-- {
				if a := as[i]; a.Key != b.Key && b.Start.Before(a.End) {
					together++
					break
				}
			}
		}
	}
	nKeys, least, most := 0, -1, 0
	for _, ks := range keys {
		nKeys += len(ks)
		if least < 0 || len(ks) < least {
			least = len(ks)
		}
		most = max(most, len(ks))
	}
	fmt.Fprintf(w, "  accounts:   %d accounts, %d keys (%d to %d an account), %d executions; at most %d of an account at once, %d overlaps (%d excused)\n",
		len(keys), nKeys, least, most, len(rec.Execs), maxAtOnce, overlaps, excused)
	fmt.Fprintf(w, "              %d attempts sent while another key of their account was in flight; 409 conflict (account busy) %d, 409 in-progress %d\n",
		together, conflicts, inProgress)
}

// accountOf is the account of key (accountKey's form); "" without one.
func accountOf(key string) string {
	account, _, ok := strings.Cut(key, "/")
	if !ok {
		return ""
	}
	return account
}

// only narrows sc to the faults in list (comma-separated; "" keeps them
// all), each rounds times (0 keeps sc's count). A kind that is not one of
// sc's is an error.
func (sc *scenario) only(list string, rounds int) error {
	if list != "" {
		var kinds []faultKind
		for _, k := range strings.Split(list, ",") {
			if !slices.Contains(sc.Kinds, faultKind(k)) {
				return fmt.Errorf("-faults: %q is not a fault of the %s phase (%v)", k, sc.Name, sc.Kinds)
			}
			kinds = append(kinds, faultKind(k))
		}
		sc.Kinds = kinds
	}
	if rounds < 0 {
		return fmt.Errorf("-rounds must not be negative")
	}
	if rounds > 0 {
		if sc.Network {
			// The network phase runs its list once: repeat it.
			sc.Kinds = slices.Repeat(sc.Kinds, rounds)
		} else {
			sc.FaultRounds = rounds
		}
	}
	return nil
}
