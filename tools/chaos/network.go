package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"
)

// The network phase: toxiproxy between each Caddy node and Redis and
// between each node and the backend, one proxy per node and link, so that a
// fault can hit some nodes and not others; its faults are toxics added to
// those proxies for a while, then removed.

// The links a fault is on.
const (
	linkRedis   = "redis"
	linkBackend = "backend"
)

// The network phase's faults: on the Redis link, latency below, around and
// above the lease, black holes, holds, a partial partition, resets, a slow
// link; on the backend link, resets, latency past the lease, black holes.
const (
	netRedisLatencyLow     faultKind = "redis-latency-low"       // both ways, around the command timeout, jitter as large
	netRedisLatencyLease   faultKind = "redis-latency-lease"     // replies late by about a lease
	netRedisLatencyHigh    faultKind = "redis-latency-high"      // commands late by more than a lease
	netRedisBlackReplies   faultKind = "redis-blackhole-replies" // commands run, replies dropped
	netRedisBlackHole      faultKind = "redis-blackhole"         // every node, both ways; the connections closed at the heal
	netRedisHold           faultKind = "redis-hold"              // every node, both ways held, delivered at the heal
	netRedisHoldSome       faultKind = "redis-hold-some"         // half the connections' commands held past a lease
	netRedisPartition      faultKind = "redis-partition"         // some nodes cut off both ways, the others not
	netRedisReset          faultKind = "redis-reset"             // half the connections reset at their next reply
	netRedisSlow           faultKind = "redis-slow"              // commands at 96 KB/s while the backend sends large answers
	netBackendReset        faultKind = "backend-reset"           // reset once the backend answers
	netBackendLatency      faultKind = "backend-latency"         // answers late by more than a lease
	netBackendBlackHole    faultKind = "backend-blackhole"       // answers dropped
	netBackendBlackHoleAll faultKind = "backend-blackhole-both"  // requests and answers dropped
)

// networkKinds are the network phase's faults, each once.
var networkKinds = []faultKind{
	netRedisLatencyLow, netRedisLatencyLease, netRedisLatencyHigh, netRedisBlackReplies, netRedisBlackHole,
	netRedisHold, netRedisHoldSome, netRedisPartition, netRedisReset, netRedisSlow,
	netBackendReset, netBackendLatency, netBackendBlackHole, netBackendBlackHoleAll,
}

// hold is a latency no fault lasts: a latency toxic with it holds what
// comes in until it is removed, and its removal delivers all of it at once.
const hold = time.Hour

// slowRate is the slow link's bandwidth, KB/s (1000 bytes).
const slowRate = 96

// netFault is what a network fault does.
type netFault struct {
	Link   string        // linkRedis or linkBackend
	Some   bool          // on some nodes (at least one, not all), drawn from the seed; else on every node
	For    time.Duration // how long its toxics stay
	Toxics []toxic       // added in this order, removed in the reverse one
}

// networkFault is kind's toxics and duration for a lease of ttl and a Redis
// command timeout of timeout; false for a kind that is not a network fault.
func networkFault(kind faultKind, ttl, timeout time.Duration) (netFault, bool) {
	ms := func(d time.Duration) int64 { return d.Milliseconds() }
	tx := func(typ, stream string, toxicity float64, attrs map[string]int64) toxic {
		return toxic{Name: typ + "-" + stream, Type: typ, Stream: stream, Toxicity: toxicity, Attributes: attrs}
	}
	latency := func(stream string, d, jitter time.Duration) toxic {
		return tx("latency", stream, 1, map[string]int64{"latency": ms(d), "jitter": ms(jitter)})
	}
	blackHole := func(stream string) toxic { return tx("timeout", stream, 1, map[string]int64{"timeout": 0}) }
	lease := ttl * 3 / 2 // past the lease: every lock taken before has expired in Redis
	switch kind {
	case netRedisLatencyLow:
		return netFault{Link: linkRedis, For: 2 * ttl, Toxics: []toxic{
			latency(upstream, timeout/2, timeout/2), latency(downstream, timeout/2, timeout/2)}}, true
	case netRedisLatencyLease:
		return netFault{Link: linkRedis, For: 2 * ttl, Toxics: []toxic{latency(downstream, ttl, ttl/4)}}, true
	case netRedisLatencyHigh:
		return netFault{Link: linkRedis, For: 2 * ttl, Toxics: []toxic{latency(upstream, ttl*7/4, ttl/2)}}, true
	case netRedisBlackReplies:
		return netFault{Link: linkRedis, For: lease, Toxics: []toxic{blackHole(downstream)}}, true
	case netRedisBlackHole:
		return netFault{Link: linkRedis, For: lease, Toxics: []toxic{blackHole(upstream), blackHole(downstream)}}, true
	case netRedisHold:
		return netFault{Link: linkRedis, For: lease, Toxics: []toxic{latency(upstream, hold, 0), latency(downstream, hold, 0)}}, true
	case netRedisHoldSome:
		// Long enough for a begin held at its start to reach Redis after
		// its give-back's mark (a lease) expired.
		t := latency(upstream, hold, 0)
		t.Toxicity = 0.5
		return netFault{Link: linkRedis, For: 2 * ttl, Toxics: []toxic{t}}, true
	case netRedisPartition:
		return netFault{Link: linkRedis, Some: true, For: lease, Toxics: []toxic{blackHole(upstream), blackHole(downstream)}}, true
	case netRedisReset:
		return netFault{Link: linkRedis, For: lease, Toxics: []toxic{tx("reset_peer", downstream, 0.5, map[string]int64{"timeout": 0})}}, true
	case netRedisSlow:
		// Upstream: what a large answer's completion sends. Not downstream:
		// there toxiproxy v2.12.0's bandwidth toxic, told to stop, first
		// waits 5s to hand on a large reply to a connection whose client
		// left (toxics/bandwidth.go), and meanwhile no new connection gets
		// through the proxy (seed 3: a 5.1s heal, and a stall of its own).
		// On some nodes: on every node, large completions queue in front of
		// every command on the few connections each node pipelines on, and
		// then no begin gets through at all (seeds 1 to 3: 503s only).
		return netFault{Link: linkRedis, Some: true, For: 3 * ttl, Toxics: []toxic{
			tx("bandwidth", upstream, 1, map[string]int64{"rate": slowRate})}}, true
	case netBackendReset:
		return netFault{Link: linkBackend, Some: true, For: lease, Toxics: []toxic{tx("reset_peer", downstream, 1, map[string]int64{"timeout": 0})}}, true
	case netBackendLatency:
		return netFault{Link: linkBackend, For: 2 * ttl, Toxics: []toxic{latency(downstream, ttl*5/4, ttl/8)}}, true
	case netBackendBlackHole:
		return netFault{Link: linkBackend, Some: true, For: 2 * ttl, Toxics: []toxic{blackHole(downstream)}}, true
	case netBackendBlackHoleAll:
		return netFault{Link: linkBackend, Some: true, For: 2 * ttl, Toxics: []toxic{blackHole(upstream), blackHole(downstream)}}, true
	}
	return netFault{}, false
}

// planNetworkFaults is the network phase's schedule: each kind once, in an
// order drawn from rng, each on every node or on some drawn from rng, from
// start on; each starts a gap drawn from rng after the one before was
// removed.
func planNetworkFaults(rng *rand.Rand, kinds []faultKind, nodes int, ttl, timeout, start, minGap, maxGap time.Duration) []plannedFault {
	kinds = slices.Clone(kinds)
	rng.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
	var plan []plannedFault
	at := start
	for _, k := range kinds {
		spec, ok := networkFault(k, ttl, timeout)
		if !ok {
			continue
		}
		f := plannedFault{Kind: k, At: at, For: spec.For}
		if spec.Some && nodes > 1 {
			f.Nodes = rng.Perm(nodes)[:1+rng.IntN(nodes-1)]
			slices.Sort(f.Nodes)
		} else {
			for i := range nodes {
				f.Nodes = append(f.Nodes, i)
			}
		}
		f.Node = f.Nodes[0]
		plan = append(plan, f)
		at += spec.For + minGap + time.Duration(rng.Int64N(int64(maxGap-minGap)+1))
	}
	return plan
}

// largeShare is the chance that a payment starting at at asks for a
// large answer: slow from a lease before a slow link to its end, so that
// large answers' completions meet it, else share.
func largeShare(plan []plannedFault, ttl time.Duration, share, slow float64) func(at time.Duration) float64 {
	return func(at time.Duration) float64 {
		for _, f := range plan {
			if f.Kind == netRedisSlow && at >= f.At-ttl && at < f.At+f.For {
				return slow
			}
		}
		return share
	}
}

// network is the phase's toxiproxy and each node's proxies.
type network struct {
	tp      *toxiproxyServer
	redis   []string // node i's proxy to Redis, where it listens
	backend []string // node i's proxy to the backend
}

func proxyName(link string, node int) string { return fmt.Sprintf("%s-%d", link, node) }

// startNetwork installs (once) and starts toxiproxy, and makes each node's
// proxies to Redis and to the backend, on free loopback ports.
func startNetwork(ctx context.Context, dir string, nodes int, redisAddr, backendAddr string, progress io.Writer) (*network, error) {
	bin, err := installToxiproxy(progress)
	if err != nil {
		return nil, err
	}
	tp, err := startToxiproxy(ctx, bin, dir)
	if err != nil {
		return nil, err
	}
	n := &network{tp: tp}
	for i := range nodes {
		for _, l := range []struct {
			link, target string
			to           *[]string
		}{{linkRedis, redisAddr, &n.redis}, {linkBackend, backendAddr, &n.backend}} {
			p, err := tp.createProxy(ctx, proxyName(l.link, i), "127.0.0.1:0", l.target)
			if err == nil && !loopback(p.Listen) {
				err = fmt.Errorf("toxiproxy: proxy %s listens on %s", p.Name, p.Listen)
			}
			if err != nil {
				tp.Close()
				return nil, err
			}
			*l.to = append(*l.to, p.Listen)
		}
	}
	return n, nil
}

func (n *network) Close() { n.tp.Close() }

// placed is a toxic added to a proxy.
type placed struct {
	proxy string
	toxic toxic
}

// apply adds toxics to link's proxy of each node, the nodes at once. It
// returns what it added, for heal, also on an error.
func (n *network) apply(ctx context.Context, link string, nodes []int, toxics []toxic) ([]placed, error) {
	var mu sync.Mutex
	var added []placed
	var errs []error
	var wg sync.WaitGroup
	for _, i := range nodes {
		wg.Go(func() {
			p := proxyName(link, i)
			for _, t := range toxics {
				err := n.tp.addToxic(ctx, p, t)
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					added = append(added, placed{proxy: p, toxic: t})
				}
				mu.Unlock()
				if err != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	return added, errors.Join(errs...)
}

// neutral are the attributes that make a toxic of typ pass everything on
// at once, or nil for one that holds nothing (timeout and reset_peer drop
// what they get).
func neutral(typ string) map[string]int64 {
	switch typ {
	case "latency":
		return map[string]int64{"latency": 0, "jitter": 0}
	case "bandwidth":
		return map[string]int64{"rate": 0} // no limit
	}
	return nil
}

// neutralWait is how long heal lets toxics made neutral hand on what they
// held before it removes them.
const neutralWait = 100 * time.Millisecond

// heal removes what apply added, each proxy's in the reverse order of
// their adding (a hold's replies let through before its commands), the
// proxies at once. A latency or bandwidth toxic is first made neutral, and
// removed neutralWait later: toxiproxy v2.12.0 removes a toxic only once
// every connection's copy has handed on what it holds, giving a connection
// whose client left 5s per piece of data (link.go, RemoveToxic), and
// meanwhile no new connection gets through the proxy; a neutral toxic
// hands it all on at once, the connections whose client left are
// dropped, and the removal takes milliseconds (TestToxiproxyHeal). Should a
// removal fail, every toxic is removed (reset).
func (n *network) heal(added []placed) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	byProxy := map[string][]toxic{}
	for _, a := range added {
		byProxy[a.proxy] = append(byProxy[a.proxy], a.toxic)
	}
	var mu sync.Mutex
	var errs []error
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	var wg sync.WaitGroup
	for p, ts := range byProxy {
		wg.Go(func() {
			waited := false
			for _, t := range slices.Backward(ts) {
				if attrs := neutral(t.Type); attrs != nil {
					if err := n.tp.updateToxic(ctx, p, t.Name, attrs); err != nil {
						fail(err)
					}
					waited = true
				}
			}
			if waited {
				time.Sleep(neutralWait)
			}
			for _, t := range slices.Backward(ts) {
				if err := n.tp.removeToxic(ctx, p, t.Name); err != nil {
					fail(err)
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return errors.Join(err, n.tp.reset(ctx))
	}
	return nil
}

// network carries out a network fault: its toxics on its nodes' proxies
// for its time, then removed.
func (in *injector) network(ctx context.Context, ev *faultEvent, f plannedFault) error {
	spec, ok := networkFault(f.Kind, in.ttl, in.timeout)
	if !ok || in.net == nil {
		return fmt.Errorf("%s: not a network fault, or no network", f.Kind)
	}
	ev.Nodes = f.Nodes
	busy := in.backend.busy(-1)
	ev.Start = time.Now()
	added, err := in.net.apply(context.WithoutCancel(ctx), spec.Link, f.Nodes, spec.Toxics)
	if err == nil {
		time.Sleep(spec.For)
	}
	ev.Back = time.Now()
	err = errors.Join(err, in.net.heal(added))
	ev.Return = time.Now()
	var ts []string
	for _, t := range spec.Toxics {
		ts = append(ts, t.String())
	}
	ev.Detail = fmt.Sprintf("%s link of nodes %v: %s for %v, %d executions in flight, healed in %v",
		spec.Link, f.Nodes, strings.Join(ts, " + "), ev.Back.Sub(ev.Start).Round(time.Millisecond), busy,
		ev.Return.Sub(ev.Back).Round(time.Millisecond))
	return err
}
