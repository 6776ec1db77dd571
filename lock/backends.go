package lock

import (
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
)

// Backend is where a Client's locks live: a *Redis or a *Redlock.
type Backend interface {
	backend() engine.Backend
}

// Redis is the Backend of one Redis deployment, through any go-redis client:
// a standalone server, a Sentinel-managed primary, a Cluster. The lock is a
// hash whose one field is the holder's token (its value the fencing token),
// so that release is the native HDEL; acquire and refresh are Lua scripts.
type Redis struct {
	r *engine.Redis
}

// NewRedis returns the Backend of rdb. For context deadlines to bound each
// call, create rdb with ContextTimeoutEnabled. A deferred autopipeliner
// (AsyncAutoPipeline) shares round trips between concurrent callers, and
// each call still gives up waiting at its deadline.
func NewRedis(rdb redis.UniversalClient) *Redis {
	return &Redis{r: engine.NewRedis(rdb)}
}

// Replication is what NewReplicatedRedis waits for.
type Replication struct {
	// Replicas is how many replicas must acknowledge a lock and each
	// renewal before it counts: Redis WAIT.
	Replicas int
	// Timeout bounds each script and its wait: the WAIT gives up at half
	// of it (or of what is left of the call's context), leaving the rest
	// for its reply. Set it to the client's read timeout.
	Timeout time.Duration
	// Direct sends each script with its WAIT, in one pipeline on one
	// connection: a *redis.Client, a failover client or a
	// *redis.ClusterClient, not an autopipeliner (which may split them
	// over two connections, and WAIT counts its own connection's writes).
	// Default: rdb.
	Direct redis.UniversalClient
}

// NewReplicatedRedis is NewRedis whose acquires and refreshes count only
// once repl.Replicas replicas have acknowledged them, so that a failover
// that promotes one of those replicas keeps the lock. One that is not
// acknowledged in time fails with an error that matches ErrUnavailable and
// ErrNotReplicated (an acquire's lock is then given back, as after any
// acquire whose outcome is unknown).
func NewReplicatedRedis(rdb redis.UniversalClient, repl Replication) *Redis {
	return &Redis{r: engine.NewReplicatedRedis(rdb, engine.Replication(repl))}
}

func (r *Redis) backend() engine.Backend { return r.r }

// Redlock is the Backend of N independent Redis masters (N odd, at least
// 3), after antirez's Redlock: a lock is held when a majority of the masters
// granted it within its validity time (ttl - elapsed - drift, drift =
// ttl/100 + 2ms, which is the local lease margin). Refresh needs a
// majority too; release goes to all. Errors name each master that failed
// (*NodeError).
//
// Fencing tokens stay strictly increasing across holders even when the
// masters' clocks or counters differ: the token is the largest the majority
// issued, and it is written back to a majority of the counters before the
// lock is granted, so that every later majority, which shares at least one
// master with it, issues a larger one.
//
// Redlock is weaker than one Redis with fencing: its safety rests on
// bounded clock drift and process pauses (see Kleppmann's "How to do
// distributed locking" and antirez's reply). Pass the fencing token on.
type Redlock struct {
	rl *engine.Redlock
}

// NewRedlock returns the Redlock of the clients, one per master; names
// (their addresses) label errors.
func NewRedlock(clients []redis.UniversalClient, names []string) (*Redlock, error) {
	rl, err := engine.NewRedlock(clients, names)
	if err != nil {
		return nil, err
	}
	return &Redlock{rl: rl}, nil
}

func (rl *Redlock) backend() engine.Backend { return rl.rl }
