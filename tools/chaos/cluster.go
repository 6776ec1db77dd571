package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

// The cluster phase's faults, on a Redis Cluster of three masters with a
// replica each and `replicas 1`: a master killed, a master stopped, a
// manual failover, busy slots migrated under load, a master killed while
// its replica lags. None has a window: with `replicas 1` nothing
// acknowledged may be lost, and a request that meets a fault waits for it
// up to its deadline, or gets 503.
const (
	clusterKill    faultKind = "cluster-kill"            // a master SIGKILLed, its replica promoted, the old master back as its replica
	clusterStop    faultKind = "cluster-stop"            // a master SIGSTOPped until its replica is promoted, then resumed as its replica
	clusterManual  faultKind = "cluster-manual-failover" // CLUSTER FAILOVER on a replica: master and replica swap, nothing lost
	clusterMigrate faultKind = "cluster-migrate"         // the slots of the payments about to run moved to another master, in batches
	clusterBehind  faultKind = "cluster-behind-kill"     // a master's replica cut off, then the master SIGKILLed and the replica promoted
)

var clusterKinds = []faultKind{clusterKill, clusterStop, clusterManual, clusterMigrate, clusterBehind}

// clusterScenario is `make chaos`'s cluster phase: three Caddy nodes on a
// Cluster of six Redis nodes with `replicas 1`, each cluster fault once;
// about a minute and a half.
func clusterScenario(seed uint64) scenario {
	return scenario{Name: "cluster", Seed: seed, Cluster: true, Nodes: 3, TTL: 2 * time.Second, Timeout: time.Second,
		Keys: 400, Spread: 50 * time.Second, Kinds: clusterKinds,
		FaultRounds: 1, FaultStart: 4 * time.Second, MinGap: 4 * time.Second, MaxGap: 6 * time.Second}
}

// chaosCluster is the cluster phase's Redis.
type chaosCluster struct{ *redistest.Cluster }

func startCluster() (*chaosCluster, error) {
	c, err := redistest.LaunchCluster(3, 1)
	if err != nil {
		return nil, err
	}
	return &chaosCluster{c}, nil
}

// redisLines are the nodes' redis block for the Cluster, with replicas 1.
func (c *chaosCluster) redisLines() []string {
	return []string{"mode cluster", "address " + strings.Join(c.Addrs(), " "), "replicas 1"}
}

// scan is scanRedis on every master, merged: each key is on its slot's.
func (c *chaosCluster) scan(ctx context.Context) redisState {
	if err := c.WaitHealthy(ctx); err != nil {
		return redisState{Err: err.Error()}
	}
	st := redisState{Records: map[string]bool{}}
	for _, m := range c.MasterAddrs() {
		s := scanRedis(ctx, m)
		st.Locks = append(st.Locks, s.Locks...)
		st.InProgress = append(st.InProgress, s.InProgress...)
		st.Abandoned = append(st.Abandoned, s.Abandoned...)
		maps.Copy(st.Records, s.Records)
		st.Counters += s.Counters
		st.GoneMarks += s.GoneMarks
		if s.Err != "" {
			st.Err = s.Err
		}
	}
	return st
}

// keySlot is a payment's start and the Cluster slot of its record (and
// lock), for a migration of the slots about to be busy.
type keySlot struct {
	At   time.Duration
	Slot int
}

func keySlots(plans []keyPlan) []keySlot {
	out := make([]keySlot, len(plans))
	for i, p := range plans {
		out[i] = keySlot{At: p.At, Slot: redistest.SlotOf(recordKeyOf(p.Key))}
	}
	return out
}

// clusterFault carries out a cluster fault on the master f.Node picks.
func (in *injector) clusterFault(ctx context.Context, ev *faultEvent, t0 time.Time) error {
	c := in.cluster
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 90*time.Second)
	defer cancel()
	masters := c.MasterAddrs()
	if len(masters) == 0 {
		return fmt.Errorf("no master answers")
	}
	master := masters[ev.Node%len(masters)]
	replicas := c.ReplicasOf(master)
	if len(replicas) != 1 && ev.Kind != clusterMigrate {
		return fmt.Errorf("master %s has replicas %v, want one", master, replicas)
	}
	busy := in.backend.busy(-1)
	ev.Start = time.Now()
	var err error
	switch ev.Kind {
	case clusterKill, clusterBehind:
		cut := ""
		if ev.Kind == clusterBehind {
			if err := redistest.CutReplicas(fctx, master, c.Node(replicas[0])); err != nil {
				return err
			}
			time.Sleep(500 * time.Millisecond)
			cut = "its replica cut off 500ms, "
		}
		if err := c.KillMaster(master); err != nil {
			return err
		}
		if ev.Kind == clusterBehind {
			if err := c.Node(replicas[0]).Resume(); err != nil {
				return err
			}
		}
		err = in.rejoin(fctx, ev, master)
		ev.Detail = fmt.Sprintf("%smaster %s killed with %d executions in flight, %s promoted after %v, the old master its replica after %v",
			cut, master, busy, replicas[0], ev.Back.Sub(ev.Start).Round(time.Millisecond), ev.Return.Sub(ev.Start).Round(time.Millisecond))
	case clusterStop:
		if err := c.Node(master).Pause(); err != nil {
			return err
		}
		err = in.rejoin(fctx, ev, master)
		ev.Detail = fmt.Sprintf("master %s stopped with %d executions in flight, %s promoted after %v, the old master resumed as its replica after %v",
			master, busy, replicas[0], ev.Back.Sub(ev.Start).Round(time.Millisecond), ev.Return.Sub(ev.Start).Round(time.Millisecond))
	case clusterManual:
		err = c.FailoverManual(fctx, replicas[0])
		ev.Back, ev.Return = time.Now(), time.Now()
		ev.Detail = fmt.Sprintf("CLUSTER FAILOVER on %s, the replica of %s, with %d executions in flight, took %v",
			replicas[0], master, busy, ev.Return.Sub(ev.Start).Round(time.Millisecond))
	case clusterMigrate:
		err = in.migrate(fctx, ev, time.Since(t0), busy)
	}
	return err
}

// rejoin waits for the failover away from master, which was killed or
// stopped, then brings it back (restarted, or resumed), and waits until it
// is its old replica's replica and the Cluster is healthy.
func (in *injector) rejoin(ctx context.Context, ev *faultEvent, master string) error {
	c := in.cluster
	err := c.WaitFailover(ctx, master)
	ev.Back = time.Now()
	if err != nil {
		return err
	}
	n := c.Node(master)
	if n.Running() {
		err = n.Resume()
	} else {
		err = n.Restart()
	}
	if err != nil {
		return err
	}
	err = c.WaitHealthy(ctx)
	ev.Return = time.Now()
	return err
}

// migrateSlots is how many of the slots about to be busy a migration moves.
const migrateSlots = 6

// migrate moves the slots of the payments that start in the next few
// seconds (at most migrateSlots), each with 100 keys of its own besides
// theirs, to the next master, one slot at a time, 10 keys a batch with
// 20ms between batches, while those payments run.
func (in *injector) migrate(ctx context.Context, ev *faultEvent, now time.Duration, busy int) error {
	c := in.cluster
	var slots []int
	for _, ks := range in.slots {
		if ks.At >= now && ks.At < now+4*time.Second && !slices.Contains(slots, ks.Slot) {
			slots = append(slots, ks.Slot)
		}
		if len(slots) == migrateSlots {
			break
		}
	}
	masters := c.MasterAddrs()
	var split time.Duration
	for _, slot := range slots {
		from, err := c.MasterOfSlot(slot)
		if err != nil {
			return err
		}
		mset := []string{"MSET"}
		tag := slotTag(slot)
		for i := range 100 {
			mset = append(mset, fmt.Sprintf("app:{%s}:%d", tag, i), "application data")
		}
		if _, err := redistest.Do(ctx, from, nil, mset...); err != nil {
			return err
		}
		to := masters[(slices.Index(masters, from)+1)%len(masters)]
		d, err := c.MigrateSlot(ctx, slot, to, 10, 20*time.Millisecond)
		if err != nil {
			return err
		}
		split += d
	}
	ev.Back, ev.Return = time.Now(), time.Now()
	ev.Detail = fmt.Sprintf("%d slots of the payments due migrated with %d executions in flight, each split %v on average, %v in all",
		len(slots), busy, (split / time.Duration(max(len(slots), 1))).Round(time.Millisecond), ev.Return.Sub(ev.Start).Round(time.Millisecond))
	return nil
}

// slotTag is a hash tag of slot: a string whose CRC16 falls in it.
func slotTag(slot int) string {
	for i := 0; ; i++ {
		if tag := fmt.Sprintf("s%d", i); redistest.SlotOf(tag) == slot {
			return tag
		}
	}
}
