package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"time"

	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

// faultKind names a fault the scenario injects.
type faultKind string

const (
	redisPause        faultKind = "redis-pause"         // SIGSTOP past the lease, then SIGCONT
	redisKillAOF      faultKind = "redis-kill-aof"      // SIGKILL, down past the lease, restarted from its AOF
	redisRestartEmpty faultKind = "redis-restart-empty" // SIGKILL, AOF removed, restarted empty
	nodeKill          faultKind = "node-kill"           // a Caddy node SIGKILLed mid-request, then restarted
	nodeReload        faultKind = "node-reload"         // a Caddy config reload, admin API or `caddy reload`
	sentinelFailover  faultKind = "sentinel-failover"   // the replica cut off, the master SIGKILLed, the replica promoted
)

// faultKinds are the full scenario's; failoverKinds the failover phase's:
// two failovers, a node killed, a reload.
var (
	faultKinds    = []faultKind{redisPause, redisKillAOF, redisRestartEmpty, nodeKill, nodeReload}
	failoverKinds = []faultKind{sentinelFailover, sentinelFailover, nodeKill, nodeReload}
)

// plannedFault is one fault of the schedule.
type plannedFault struct {
	Kind  faultKind
	At    time.Duration // after the traffic starts
	Node  int           // node-kill, node-reload
	Nodes []int         // a network fault's nodes
	For   time.Duration // how long a network fault lasts
}

// planFaults is the schedule: each kind rounds times (node kills and
// reloads once more when rounds > 1), in an order and at gaps drawn from
// rng, from start on. Faults never overlap: one due while the one before
// still runs starts when that one ends.
func planFaults(rng *rand.Rand, of []faultKind, rounds, nodes int, start, minGap, maxGap time.Duration) []plannedFault {
	var kinds []faultKind
	for r := range rounds {
		kinds = append(kinds, of...)
		if r > 0 || rounds == 1 {
			continue
		}
		kinds = append(kinds, nodeKill, nodeReload)
	}
	rng.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
	var plan []plannedFault
	at := start
	for _, k := range kinds {
		plan = append(plan, plannedFault{Kind: k, At: at, Node: rng.IntN(nodes)})
		at += minGap + time.Duration(rng.Int64N(int64(maxGap-minGap)+1))
	}
	return plan
}

// faultEvent is a fault as it happened.
type faultEvent struct {
	Kind   faultKind
	Node   int
	Nodes  []int     // the nodes whose links a network fault was on
	Start  time.Time // the signal, or the reload's start
	Return time.Time // Redis answers again, the node listens again, the reload returned
	// Back is when Redis could first answer again: SIGCONT or the restart
	// was about to be sent (a node may reach the new server before Restart
	// has returned); zero for node faults.
	Back   time.Time
	Detail string
	Err    string
}

// injector carries out the schedule against the running processes.
type injector struct {
	redis    *chaosRedis    // the full scenario's
	sentinel *chaosSentinel // the failover phase's
	cluster  *chaosCluster  // the cluster phase's
	slots    []keySlot      // the cluster phase's: where the payments' keys are
	net      *network       // the network phase's
	nodes    []*node
	backend  *backend
	ttl      time.Duration
	timeout  time.Duration // Redis command timeout in the nodes
	reloads  int
}

// run carries out plan from t0 until it is done or ctx ends, and returns
// what happened. A fault that starts always ends: Redis is resumed or
// restarted and a node restarted even when ctx ends meanwhile.
func (in *injector) run(ctx context.Context, t0 time.Time, plan []plannedFault) []faultEvent {
	var events []faultEvent
	for _, f := range plan {
		wait := time.Until(t0.Add(f.At))
		select {
		case <-ctx.Done():
			return events
		case <-time.After(wait):
		}
		ev := faultEvent{Kind: f.Kind, Node: f.Node}
		var err error
		switch f.Kind {
		case redisPause:
			err = in.pause(&ev)
		case redisKillAOF:
			err = in.killRedis(&ev, false)
		case redisRestartEmpty:
			err = in.killRedis(&ev, true)
		case nodeKill:
			err = in.killNode(&ev)
		case nodeReload:
			err = in.reload(ctx, &ev)
		case sentinelFailover:
			err = in.failover(ctx, &ev)
		case clusterKill, clusterStop, clusterManual, clusterMigrate, clusterBehind:
			err = in.clusterFault(ctx, &ev, t0)
		default:
			err = in.network(ctx, &ev, f)
		}
		if err != nil {
			ev.Err = err.Error()
		}
		events = append(events, ev)
	}
	return events
}

// outage is how long Redis stays away: past the lease, so that every lock
// taken before it has expired when Redis answers again.
func (in *injector) outage() time.Duration { return in.ttl + in.ttl/2 }

func (in *injector) pause(ev *faultEvent) error {
	before := in.backend.busy(-1)
	ev.Start = time.Now()
	if err := in.redis.Pause(); err != nil {
		return err
	}
	time.Sleep(in.outage())
	ev.Back = time.Now()
	err := in.redis.Resume()
	ev.Return = time.Now()
	ev.Detail = fmt.Sprintf("paused %v, %d executions in flight at the pause", ev.Return.Sub(ev.Start).Round(time.Millisecond), before)
	return err
}

func (in *injector) killRedis(ev *faultEvent, empty bool) error {
	keysBefore := dbsize(in.redis.Addr)
	ev.Start = time.Now()
	in.redis.Stop() // SIGKILL
	if empty {
		if err := in.redis.wipe(); err != nil {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	} else {
		time.Sleep(in.outage())
	}
	ev.Back = time.Now()
	err := in.redis.Restart()
	ev.Return = time.Now()
	ev.Detail = fmt.Sprintf("down %v, keys %d before, %d after the restart",
		ev.Return.Sub(ev.Start).Round(time.Millisecond), keysBefore, dbsize(in.redis.Addr))
	return err
}

// failover puts the replica behind under the traffic (its link cut, then
// paused, so that it misses what the master writes from then on), kills
// the master, resumes the replica and waits for the Sentinels to promote
// it, then restarts the old master, which they turn into its replica. With
// `replicas 1` nothing whose answer was given may be lost: no window.
func (in *injector) failover(ctx context.Context, ev *faultEvent) error {
	s := in.sentinel
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 90*time.Second)
	defer cancel()
	master, err := s.MasterAddr(fctx)
	if err != nil {
		return err
	}
	replica := s.Replica(master)
	busy := in.backend.busy(-1)
	ev.Start = time.Now()
	if err := redistest.CutReplicas(fctx, master, replica); err != nil {
		return err
	}
	time.Sleep(500 * time.Millisecond)
	s.Node(master).Stop()
	if err := replica.Resume(); err != nil {
		return err
	}
	promoted, err := s.WaitStableWithout(fctx, master)
	ev.Back = time.Now()
	if err != nil {
		return err
	}
	if err := s.Node(master).Restart(); err != nil {
		return err
	}
	_, err = s.WaitStable(fctx)
	ev.Return = time.Now()
	ev.Detail = fmt.Sprintf("replica cut off 500ms with %d executions in flight, master %s killed, %s promoted after %v, the old master its replica after %v",
		busy, master, promoted, ev.Back.Sub(ev.Start).Round(time.Millisecond), ev.Return.Sub(ev.Start).Round(time.Millisecond))
	return err
}

// killNode waits (up to a lease) until the node has a request at the
// backend, so that it dies mid-request, kills it, and restarts it a second
// later on the same ports.
func (in *injector) killNode(ev *faultEvent) error {
	n := in.nodes[ev.Node]
	deadline := time.Now().Add(in.ttl)
	for in.backend.busy(ev.Node) == 0 && time.Now().Before(deadline) {
		time.Sleep(2 * time.Millisecond)
	}
	busy := in.backend.busy(ev.Node)
	ev.Start = time.Now()
	n.kill()
	time.Sleep(time.Second)
	err := n.start()
	ev.Return = time.Now()
	ev.Detail = fmt.Sprintf("node %d killed with %d executions in flight, back after %v",
		ev.Node, busy, ev.Return.Sub(ev.Start).Round(time.Millisecond))
	return err
}

// reload alternates between the admin API's POST /load and `caddy reload`.
func (in *injector) reload(ctx context.Context, ev *faultEvent) error {
	n := in.nodes[ev.Node]
	in.reloads++
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	busy := in.backend.busy(ev.Node)
	ev.Start = time.Now()
	var err error
	how := "POST /load"
	if in.reloads%2 == 0 {
		how = "caddy reload --force"
		err = n.reloadCommand(rctx)
	} else {
		err = n.reloadAPI(rctx)
	}
	ev.Return = time.Now()
	ev.Detail = fmt.Sprintf("node %d reloaded (%s) with %d executions in flight, took %v",
		ev.Node, how, busy, ev.Return.Sub(ev.Start).Round(time.Millisecond))
	return err
}

// dbsize is DBSIZE by hand (-1 on error): the count of keys, for the fault
// log, showing what the AOF brought back.
func dbsize(addr string) int {
	c, err := net.DialTimeout("tcp", addr, 300*time.Millisecond)
	if err != nil {
		return -1
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("DBSIZE\r\n")); err != nil {
		return -1
	}
	buf := make([]byte, 64)
	k, err := c.Read(buf)
	if err != nil {
		return -1
	}
	var n int
	if _, err := fmt.Sscanf(strings.TrimSpace(string(buf[:k])), ":%d", &n); err != nil {
		return -1
	}
	return n
}
