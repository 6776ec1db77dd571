package redisscript

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
)

// route is where a try goes after Redis Cluster redirected the one before
// it: the node at addr, with ASKING first after an ASK. The zero route is
// the master of the key's slot as the client knows it.
//
// The Conn follows the redirects itself, on the calls through the cluster
// client too, whose own following is turned off (redisconn sets
// MaxRedirects to none): within one pipeline go-redis sends a command
// that got ASK to the ASK's node and, when the batch's first command got a
// retryable error (TRYAGAIN, while a slot migrates), the whole batch again
// to the slot's master, so that one command runs on two nodes at once,
// whose replies race to fill it in (the race detector sees it).
type route struct {
	addr   string
	asking bool
}

// clusterNodes are the clients of a Cluster client's nodes by address, as
// the cluster client makes them (for its slot layout, or a redirect): the
// node a MOVED or an ASK names.
type clusterNodes struct {
	cc     *redis.ClusterClient
	byAddr sync.Map // addr -> *redis.Client
}

func newClusterNodes(cc *redis.ClusterClient) *clusterNodes {
	n := &clusterNodes{cc: cc}
	cc.OnNewNode(func(rdb *redis.Client) { n.byAddr.Store(rdb.Options().Addr, rdb) })
	return n
}

// at is the client of the node at addr, nil when the slot layout (reloaded
// for a node not seen yet) does not name it either: a new master that
// serves no slot yet, say. Then the try goes to the slot's master instead,
// which redirects it again, until the migration ends (its MOVED names a
// node in the layout).
func (n *clusterNodes) at(ctx context.Context, addr string) *redis.Client {
	if rdb, ok := n.byAddr.Load(addr); ok {
		return rdb.(*redis.Client)
	}
	var found *redis.Client
	var mu sync.Mutex
	_ = n.cc.ForEachShard(ctx, func(_ context.Context, rdb *redis.Client) error {
		a := rdb.Options().Addr
		n.byAddr.LoadOrStore(a, rdb)
		if a == addr {
			mu.Lock()
			found = rdb
			mu.Unlock()
		}
		return nil
	})
	return found
}

// forKey is the client a try of a call on key's slot goes on, after r, and
// whether it must send ASKING first.
func (n *clusterNodes) forKey(ctx context.Context, key string, r route) (*redis.Client, bool, error) {
	if r.addr != "" {
		if rdb := n.at(ctx, r.addr); rdb != nil {
			return rdb, r.asking, nil
		}
	}
	rdb, err := n.cc.MasterForKey(ctx, key)
	return rdb, false, err
}

// redirected is the client a try after r goes on instead of c's own (its
// cluster client or autopipeliner), and whether it sends ASKING first; nil
// for the zero route, or a node the layout does not name.
func (c *Conn) redirected(ctx context.Context, r route) (*redis.Client, bool) {
	if r.addr == "" || c.nodes == nil {
		return nil, false
	}
	return c.nodes.at(ctx, r.addr), r.asking
}

// setCluster makes cc the Cluster client whose calls c retries (retry)
// and redirects.
func (c *Conn) setCluster(cc *redis.ClusterClient) {
	if cc != nil && c.cluster == nil {
		c.cluster, c.nodes = cc, newClusterNodes(cc)
	}
}

// clusterOf is the first of clients that is a Cluster client, or nil.
func clusterOf(clients ...redis.UniversalClient) *redis.ClusterClient {
	for _, rdb := range clients {
		if cc, ok := rdb.(*redis.ClusterClient); ok {
			return cc
		}
	}
	return nil
}
