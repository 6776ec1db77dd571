package redisconn

import (
	"errors"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
)

// The lock backend on the go-redis clients: each client through its
// deferred autopipeliner, and in Redlock mode a Redlock over one such
// backend per master. The one file that builds lock backends.

// asyncPipeliner is a go-redis client that has a deferred autopipeliner.
type asyncPipeliner interface {
	redis.UniversalClient
	AsyncAutoPipelineWithOptions(*redis.AutoPipelineOptions) (*redis.AutoPipeliner, error)
}

// maxQueuedCommands bounds the commands waiting in a client's pipeline.
const maxQueuedCommands = 10000

// pipelined is the lock backend of rdb through its deferred autopipeliner.
// Concurrent requests' lock commands share write and read system calls
// that way, which costs Redis much less CPU per request than one round trip
// per command (bench/README.md); a command sent while no other is in flight
// goes on rdb itself, sparing it the autopipeliner's hand-offs. The
// deferred face, because a command queued in a pipeline is sent whatever
// its context says: the lock library
// waits on each command's future and gives up at its own deadline
// (engine.Config.CallTimeout). With replicas, each script goes on rdb itself
// instead, with its WAIT in one pipeline on one connection.
func pipelined(rdb asyncPipeliner, o *Options) (engine.Master, func() error, error) {
	opt := redis.DefaultBlockingAutoPipelineOptions()
	// A Redis that stops answering must not queue commands without end:
	// past this many, a request gets 503 at once.
	opt.MaxQueuedCommands = maxQueuedCommands
	ap, err := rdb.AsyncAutoPipelineWithOptions(opt)
	if err != nil {
		return nil, nil, errors.Join(err, rdb.Close())
	}
	b := engine.NewPipelinedRedis(ap, rdb, engine.Replication{Replicas: o.Replicas, Timeout: o.Timeout})
	b.Conn().ObserveRetries(o.OnRetry)
	return b, func() error { return errors.Join(ap.Close(), rdb.Close()) }, nil
}

// redlock is the Redlock over one pipelined backend per master of o, each
// on the client that client builds for its address.
func redlock(o *Options, client func(addr string) asyncPipeliner) (engine.Backend, func() error, error) {
	var nodes []engine.Master
	var closers []func() error
	for _, addr := range o.Addresses {
		b, closeNode, err := pipelined(client(addr), o)
		if err != nil {
			return nil, nil, errors.Join(err, closeAll(closers)())
		}
		nodes, closers = append(nodes, b), append(closers, closeNode)
	}
	rl, err := engine.NewRedlockOf(nodes, o.Addresses)
	if err != nil {
		return nil, nil, errors.Join(err, closeAll(closers)())
	}
	return rl, closeAll(closers), nil
}

// closeAll closes each of closers.
func closeAll(closers []func() error) func() error {
	return func() error {
		var errs []error
		for _, c := range closers {
			errs = append(errs, c())
		}
		return errors.Join(errs...)
	}
}
