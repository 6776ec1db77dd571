package redisconn

import (
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
)

// newClients builds the go-redis clients of o's mode with opt, and the
// lock backend on them; close closes them.
func newClients(o *Options, opt *redis.UniversalOptions, rec *Recovery) (b engine.Backend, close func() error, err error) {
	switch o.Mode {
	case Sentinel:
		// A failover client follows the Sentinels' +switch-master and
		// reconnects to the new primary, with no restart. Its options have
		// no Limiter: the backoff is a hook there.
		rdb := redis.NewFailoverClient(opt.Failover())
		rdb.AddHook(newAuthBackoff(rec))
		return pipelined(rdb, o)
	case Cluster:
		// The cluster client routes each script to the node of its keys'
		// slot (a lock, its counter and its record share one), and follows
		// MOVED and ASK redirects and failovers.
		co := opt.Cluster()
		// go-redis reloads the slot layout on MOVED, but not when the
		// master of a slot stops answering: without a short reload
		// interval (its default is a minute) the slots of a failed
		// master stay on it long after its replica took over.
		co.ClusterStateReloadInterval = time.Second
		// No redirect followed within go-redis (-1: none), but by the
		// backend's Conn, until the call's deadline (redisscript's retry):
		// go-redis's pipelines can send one command to two nodes at once
		// after an ASK and a TRYAGAIN in one batch.
		co.MaxRedirects = -1
		co.NewClient = func(o *redis.Options) *redis.Client {
			o.Limiter = newAuthBackoff(rec)
			return redis.NewClient(o)
		}
		return pipelined(redis.NewClusterClient(co), o)
	case Redlock:
		return redlock(o, func(addr string) asyncPipeliner {
			return redis.NewClient(serverOptions(opt, addr, rec))
		})
	}
	return pipelined(redis.NewClient(serverOptions(opt, o.Addresses[0], rec)), o)
}

// serverOptions are the options of a client of the one server at addr.
func serverOptions(opt *redis.UniversalOptions, addr string, rec *Recovery) *redis.Options {
	o := opt.Simple()
	o.Addr = addr
	o.Limiter = newAuthBackoff(rec)
	return o
}
