package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"testing"
	"time"
)

// ClusterNodeTimeout is the --cluster-node-timeout of every cluster node:
// small so that a failover after KillMaster takes seconds, not the default
// 15s, yet above the stalls a loaded 2-core test machine causes.
const ClusterNodeTimeout = 2000 * time.Millisecond

// clusterSlots is the number of hash slots in Redis Cluster.
const clusterSlots = 16384

// Cluster is a Redis Cluster of real redis-server processes on 127.0.0.1.
// Roles move on failover: ask MasterAddrs or MasterForKey rather than keeping
// addresses from the start. Its methods must not run concurrently with Stop
// or Restart of its nodes.
type Cluster struct {
	masters int
	nodes   []*Server
	byAddr  map[string]*Server
}

// StartCluster starts a cluster of masters masters with replicasPerMaster
// replicas each, stopped when tb ends. A failover by KillMaster needs a
// majority of the masters alive to vote: use at least 3 masters for it.
func StartCluster(tb testing.TB, masters, replicasPerMaster int) *Cluster {
	tb.Helper()
	Require(tb)
	c, err := LaunchCluster(masters, replicasPerMaster)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Close)
	return c
}

// LaunchCluster starts a cluster and waits until every node reports
// cluster_state:ok and every replica is attached; the caller must Close it
// (for sharing one cluster across a package from TestMain or a sync.Once).
func LaunchCluster(masters, replicasPerMaster int) (*Cluster, error) {
	if masters < 1 || replicasPerMaster < 0 {
		return nil, fmt.Errorf("redistest: cluster of %d masters, %d replicas each", masters, replicasPerMaster)
	}
	c := &Cluster{masters: masters, byAddr: map[string]*Server{}}
	if err := c.launch(replicasPerMaster); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) launch(replicas int) error {
	ms := strconv.Itoa(int(ClusterNodeTimeout / time.Millisecond))
	n := c.masters * (1 + replicas)
	for range n {
		s, err := launch(spec{
			pickPort: clusterPort,
			args: []string{
				"--cluster-enabled", "yes",
				"--cluster-config-file", "nodes.conf",
				"--cluster-node-timeout", ms,
				// A replica may always stand for election: on a loaded
				// machine its last contact with the master can look old.
				"--cluster-replica-validity-factor", "0",
				// Initial sync without the default 5s wait for more replicas.
				"--repl-diskless-sync-delay", "0",
			},
		})
		if err != nil {
			return err
		}
		c.nodes = append(c.nodes, s)
		c.byAddr[s.Addr] = s
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ids := make([]string, n)
	for i, s := range c.nodes {
		id, err := DoString(ctx, s.Addr, nil, "CLUSTER", "MYID")
		if err != nil {
			return err
		}
		ids[i] = id
		// Distinct epochs up front, as redis-cli does, so the nodes need not
		// resolve epoch collisions before the cluster is usable.
		if _, err := Do(ctx, s.Addr, nil, "CLUSTER", "SET-CONFIG-EPOCH", strconv.Itoa(i+1)); err != nil {
			return err
		}
	}
	for i := range c.masters {
		from, to := i*clusterSlots/c.masters, (i+1)*clusterSlots/c.masters-1
		if _, err := Do(ctx, c.nodes[i].Addr, nil, "CLUSTER", "ADDSLOTSRANGE", strconv.Itoa(from), strconv.Itoa(to)); err != nil {
			return err
		}
	}
	for _, s := range c.nodes[1:] {
		if _, err := Do(ctx, c.nodes[0].Addr, nil, "CLUSTER", "MEET", "127.0.0.1", strconv.Itoa(s.Port)); err != nil {
			return err
		}
	}
	// CLUSTER REPLICATE needs the master known to the replica.
	err := eventually(ctx, "cluster nodes meet", func(ctx context.Context) error {
		for _, s := range c.nodes {
			view, err := clusterView(ctx, s.Addr)
			if err != nil {
				return err
			}
			if len(view) != n {
				return fmt.Errorf("%s knows %d of %d nodes", s.Addr, len(view), n)
			}
			for _, v := range view {
				if v.has("handshake") || v.has("noaddr") {
					return fmt.Errorf("%s sees %s as %s", s.Addr, v.addr, v.flags)
				}
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	for i := c.masters; i < n; i++ {
		master := ids[(i-c.masters)%c.masters]
		if _, err := Do(ctx, c.nodes[i].Addr, nil, "CLUSTER", "REPLICATE", master); err != nil {
			return err
		}
	}
	return c.WaitHealthy(ctx)
}

// clusterPort returns a free port below 55000 whose cluster bus port
// (port+10000) is free too.
func clusterPort() (int, error) {
	for range 100 {
		p, err := FreePort()
		if err != nil {
			return 0, err
		}
		if p >= 55000 {
			continue
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+10000))
		if err != nil {
			continue
		}
		l.Close()
		return p, nil
	}
	return 0, errors.New("redistest: no free port pair for a cluster node")
}

// Addrs returns the addresses of all nodes, running or not, in start order.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.nodes))
	for i, s := range c.nodes {
		out[i] = s.Addr
	}
	return out
}

// Node returns the node at addr, or nil.
func (c *Cluster) Node(addr string) *Server { return c.byAddr[addr] }

// MasterAddrs returns the masters serving slots, by slot order, as a running
// node sees them now; nil when no node answers.
func (c *Cluster) MasterAddrs() []string {
	view, err := c.liveView()
	if err != nil {
		return nil
	}
	var ms []clusterNode
	for _, v := range view {
		if v.has("master") && !v.has("fail") && len(v.slots) > 0 {
			ms = append(ms, v)
		}
	}
	slices.SortFunc(ms, func(a, b clusterNode) int { return a.firstSlot() - b.firstSlot() })
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.addr
	}
	return out
}

// ReplicasOf returns the replicas of the master at addr that are not failed,
// as a running node sees them now.
func (c *Cluster) ReplicasOf(masterAddr string) []string {
	view, err := c.liveView()
	if err != nil {
		return nil
	}
	var id string
	for _, v := range view {
		if v.addr == masterAddr {
			id = v.id
		}
	}
	var out []string
	for _, v := range view {
		if id != "" && v.master == id && !v.has("fail") {
			out = append(out, v.addr)
		}
	}
	slices.Sort(out)
	return out
}

// MasterForKey returns the master that serves key's slot now, so a test can
// kill exactly the node holding its lock.
func (c *Cluster) MasterForKey(ctx context.Context, key string) (string, error) {
	for _, s := range c.nodes {
		if !s.Running() {
			continue
		}
		v, err := Do(ctx, s.Addr, nil, "CLUSTER", "KEYSLOT", key)
		slot, ok := v.(int64)
		if err != nil || !ok {
			continue
		}
		view, err := clusterView(ctx, s.Addr)
		if err != nil {
			continue
		}
		for _, v := range view {
			if v.has("master") && !v.has("fail") && v.serves(int(slot)) {
				return v.addr, nil
			}
		}
		return "", fmt.Errorf("redistest: no master serves slot %d of %q", slot, key)
	}
	return "", errors.New("redistest: no cluster node answers")
}

// KillMaster stops the master at addr hard (SIGKILL), as a crash would; call
// WaitFailover to wait for its replica to take over.
func (c *Cluster) KillMaster(addr string) error {
	s := c.byAddr[addr]
	if s == nil {
		return fmt.Errorf("redistest: %s is not a node of this cluster", addr)
	}
	if !slices.Contains(c.MasterAddrs(), addr) {
		return fmt.Errorf("redistest: %s is not a master now", addr)
	}
	s.Stop()
	return nil
}

// WaitFailover waits until the slots of the master at oldMasterAddr are served
// by another node and every other running node reports cluster_state:ok with
// all replicas attached. The old master is left out whether it was killed or
// paused.
func (c *Cluster) WaitFailover(ctx context.Context, oldMasterAddr string) error {
	return c.waitHealthy(ctx, oldMasterAddr)
}

// FailoverManual makes the replica at replicaAddr take over its master with
// CLUSTER FAILOVER (no data loss, the old master becomes its replica) and
// waits until every node agrees and the cluster is healthy again.
func (c *Cluster) FailoverManual(ctx context.Context, replicaAddr string) error {
	if c.byAddr[replicaAddr] == nil {
		return fmt.Errorf("redistest: %s is not a node of this cluster", replicaAddr)
	}
	var sent time.Time
	return eventually(ctx, "manual failover to "+replicaAddr, func(ctx context.Context) error {
		info, err := DoString(ctx, replicaAddr, nil, "INFO", "replication")
		if err != nil {
			return err
		}
		// A manual failover that timed out (5s in Redis) is asked again.
		if InfoField(info, "role") == "slave" && time.Since(sent) > 8*time.Second {
			if _, err := Do(ctx, replicaAddr, nil, "CLUSTER", "FAILOVER"); err != nil {
				return err
			}
			sent = time.Now()
		}
		if err := c.checkHealthy(ctx, ""); err != nil {
			return err
		}
		if !slices.Contains(c.MasterAddrs(), replicaAddr) {
			return fmt.Errorf("%s is not a master yet", replicaAddr)
		}
		return nil
	})
}

// WaitHealthy waits until every running node reports cluster_state:ok, sees
// every other running node without failure flags, and agrees on the roles,
// and every running replica has its replication link up.
func (c *Cluster) WaitHealthy(ctx context.Context) error { return c.waitHealthy(ctx, "") }

func (c *Cluster) waitHealthy(ctx context.Context, exclude string) error {
	return eventually(ctx, "cluster healthy", func(ctx context.Context) error { return c.checkHealthy(ctx, exclude) })
}

func (c *Cluster) checkHealthy(ctx context.Context, exclude string) error {
	live := map[string]bool{}
	for _, s := range c.nodes {
		if s.Running() && s.Addr != exclude {
			live[s.Addr] = true
		}
	}
	if len(live) == 0 {
		return errors.New("no running node")
	}
	// role of each live node by its own account: "master" or its master's id
	self := map[string]clusterNode{}
	views := map[string][]clusterNode{}
	for addr := range live {
		info, err := DoString(ctx, addr, nil, "CLUSTER", "INFO")
		if err != nil {
			return fmt.Errorf("%s: %w", addr, err)
		}
		if st := InfoField(info, "cluster_state"); st != "ok" {
			return fmt.Errorf("%s: cluster_state:%s", addr, st)
		}
		view, err := clusterView(ctx, addr)
		if err != nil {
			return fmt.Errorf("%s: %w", addr, err)
		}
		views[addr] = view
		for _, v := range view {
			if v.has("myself") {
				self[addr] = v
			}
		}
	}
	for addr, view := range views {
		masters := 0
		for _, v := range view {
			if v.has("master") && len(v.slots) > 0 {
				if !live[v.addr] {
					return fmt.Errorf("%s: slots still on %s (%s)", addr, v.addr, v.flags)
				}
				masters++
			}
			if !live[v.addr] {
				continue
			}
			if v.has("fail") || v.has("fail?") || v.has("handshake") || v.has("noaddr") {
				return fmt.Errorf("%s sees %s as %s", addr, v.addr, v.flags)
			}
			if !v.has("myself") && v.link != "connected" {
				return fmt.Errorf("%s: bus link to %s %s", addr, v.addr, v.link)
			}
			if me := self[v.addr]; me.master != v.master || me.has("master") != v.has("master") {
				return fmt.Errorf("%s sees %s as %s of %s, it says %s of %s", addr, v.addr, v.flags, v.master, me.flags, me.master)
			}
		}
		if masters != c.masters {
			return fmt.Errorf("%s sees %d masters with slots, want %d", addr, masters, c.masters)
		}
	}
	for addr, me := range self {
		if me.has("master") {
			continue
		}
		info, err := DoString(ctx, addr, nil, "INFO", "replication")
		if err != nil {
			return fmt.Errorf("%s: %w", addr, err)
		}
		if st := InfoField(info, "master_link_status"); st != "up" {
			return fmt.Errorf("replica %s: master_link_status:%s", addr, st)
		}
	}
	return nil
}

// Close stops every node and removes their directories.
func (c *Cluster) Close() {
	for _, s := range c.nodes {
		s.Close()
	}
}
