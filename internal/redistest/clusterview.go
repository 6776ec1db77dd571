package redistest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// liveView is the cluster as a running node sees it (CLUSTER NODES).
func (c *Cluster) liveView() ([]clusterNode, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var err error = errors.New("redistest: no running cluster node")
	for _, s := range c.nodes {
		if !s.Running() {
			continue
		}
		var view []clusterNode
		if view, err = clusterView(ctx, s.Addr); err == nil {
			return view, nil
		}
	}
	return nil, err
}

// clusterNode is one line of CLUSTER NODES.
type clusterNode struct {
	id, addr, flags, master, link string
	slots                         []string
}

func (n clusterNode) has(flag string) bool {
	return slices.Contains(strings.Split(n.flags, ","), flag)
}

func (n clusterNode) slotRanges() [][2]int {
	var out [][2]int
	for _, s := range n.slots {
		if strings.HasPrefix(s, "[") { // a slot being migrated
			continue
		}
		a, b, ok := strings.Cut(s, "-")
		from, _ := strconv.Atoi(a)
		to := from
		if ok {
			to, _ = strconv.Atoi(b)
		}
		out = append(out, [2]int{from, to})
	}
	return out
}

func (n clusterNode) firstSlot() int {
	r := n.slotRanges()
	if len(r) == 0 {
		return clusterSlots
	}
	return r[0][0]
}

func (n clusterNode) serves(slot int) bool {
	for _, r := range n.slotRanges() {
		if slot >= r[0] && slot <= r[1] {
			return true
		}
	}
	return false
}

func clusterView(ctx context.Context, addr string) ([]clusterNode, error) {
	out, err := DoString(ctx, addr, nil, "CLUSTER", "NODES")
	if err != nil {
		return nil, err
	}
	var view []clusterNode
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			return nil, fmt.Errorf("redistest: CLUSTER NODES line %q", line)
		}
		a, _, _ := strings.Cut(f[1], "@") // ip:port@cport[,hostname]
		view = append(view, clusterNode{id: f[0], addr: a, flags: f[2], master: f[3], link: f[7], slots: f[8:]})
	}
	return view, nil
}
