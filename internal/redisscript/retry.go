package redisscript

import (
	"context"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"time"

	"github.com/redis/go-redis/v9"
)

// The causes of a retry on a Cluster, as a Conn's RetryObserver gets them
// (the metrics' cause label).
const (
	CauseMoved        = "moved"        // the slot moved to another master (a reshard's end, a failover)
	CauseAsk          = "ask"          // the slot is migrating and the keys are on its target
	CauseTryAgain     = "tryagain"     // the slot is migrating and the script's keys are split between nodes
	CauseClusterDown  = "clusterdown"  // a master failed and no replica has taken over yet
	CauseLoading      = "loading"      // the node is loading its data (a restart)
	CauseReadOnly     = "readonly"     // the node became a replica (a failover)
	CauseMasterDown   = "masterdown"   // a replica whose master is down
	CauseUnreplicated = "unreplicated" // fewer replicas than asked acknowledged the write (a failover's new master)
	CauseConnection   = "connection"   // the node refused, dropped or did not answer the connection (a failed master)
)

// Causes are every cause of a retry, in the order of the constants.
var Causes = []string{CauseMoved, CauseAsk, CauseTryAgain, CauseClusterDown, CauseLoading,
	CauseReadOnly, CauseMasterDown, CauseUnreplicated, CauseConnection}

// RetryObserver is told of each retry of a Conn's calls on a Cluster with its
// cause, and of each call that reached its deadline while it was retried
// (exhausted), with the cause of the last retry.
type RetryObserver func(cause string, exhausted bool)

// ObserveRetries makes f the observer of c's retries. Call it before c is
// used.
func (c *Conn) ObserveRetries(f RetryObserver) { c.observer = f }

// The pauses between the tries of one call (but a redirect, followed at
// once): jitter over an exponential step, so that the requests a reshard
// holds back do not come back all at once.
const (
	minRetryPause = 4 * time.Millisecond
	maxRetryPause = 128 * time.Millisecond
)

// RetryError is a call on a Cluster that reached its deadline while it was
// being retried: Err is the last error that was worth a retry, Cause its
// cause. It matches ErrUnavailable through Classify, and what Err matches
// (ErrNotReplicated, say).
type RetryError struct {
	Cause string
	Tries int
	Err   error
}

func (e *RetryError) Error() string {
	return fmt.Sprintf("redis cluster: deadline reached after %d tries (last: %s): %v", e.Tries, e.Cause, e.Err)
}

func (e *RetryError) Unwrap() error { return e.Err }

// retry runs try, and on a Cluster runs it again while it fails with an
// error that says the call was not run, or may be run elsewhere once the
// Cluster has settled (retryCause), with jittered pauses, until ctx's
// deadline: never past it, and not at all without one. go-redis's own
// budgets are counts (MaxRedirects, MaxRetries), spent within tens of
// milliseconds, while a slot migration (TRYAGAIN for a script whose keys
// are not all on one node) or a failover (CLUSTERDOWN, then the dead
// master's refusals until the slot layout is reloaded) lasts seconds.
//
// A retry is safe because every script is idempotent for its own token
// (docs/design.md, "Retries are safe"): one run before, whose reply was
// lost, makes the retry find its own lock or record.
func (c *Conn) retry(ctx context.Context, try func(route) error) error {
	err := try(route{})
	if err == nil || c.cluster == nil {
		return err
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		return err
	}
	pause := minRetryPause
	tries := 1
	var last error // the last error worth a retry
	var lastCause string
	followed := false // the last try followed a redirect at once
	for {
		cause := retryCause(err)
		var reply redis.Error
		switch {
		case cause == "" && (last == nil || ctx.Err() == nil || errors.As(err, &reply)):
			return err // an answer, or the caller's own end
		case last != nil && ctx.Err() != nil:
			// The try ran into the deadline: the call gives up with
			// what kept it from running before.
			return c.exhausted(lastCause, tries, last)
		}
		last, lastCause = err, cause
		r := c.redirect(ctx, err, cause)
		// A redirect is followed at once, as go-redis would; one that
		// follows a redirect (two nodes sending the call back and forth
		// while a migration's end reaches them) waits as any retry.
		var sleep time.Duration
		if followed = r.addr != "" && !followed; !followed {
			sleep = pause/2 + mrand.N(pause/2+1)
			pause = min(2*pause, maxRetryPause)
		}
		if !sleepUntil(ctx, min(sleep, time.Until(deadline))) || !time.Now().Before(deadline) {
			return c.exhausted(cause, tries, err)
		}
		c.observe(cause, false)
		tries++
		if err = try(r); err == nil {
			return nil
		}
	}
}

// exhausted is retry's error when ctx's deadline passed: last, the error of
// the last try that was worth a retry.
func (c *Conn) exhausted(cause string, tries int, last error) error {
	c.observe(cause, true)
	return &RetryError{Cause: cause, Tries: tries, Err: last}
}

func (c *Conn) observe(cause string, exhausted bool) {
	if c.observer != nil {
		c.observer(cause, exhausted)
	}
}

// redirect is the route of the try after one that failed with err: the
// node a MOVED or an ASK names. After a MOVED, a failover's errors and a
// node's refusal the slot layout is reloaded too (in the background: once
// at a time, and at most every 200ms), since the client reloads it by
// itself only every ClusterStateReloadInterval when a dead master sends no
// MOVED.
func (c *Conn) redirect(ctx context.Context, err error, cause string) route {
	switch cause {
	case CauseAsk:
		addr, _ := redis.IsAskError(err)
		return route{addr: addr, asking: true}
	case CauseMoved:
		addr, _ := redis.IsMovedError(err)
		c.cluster.ReloadState(ctx)
		return route{addr: addr}
	case CauseClusterDown, CauseReadOnly, CauseConnection:
		c.cluster.ReloadState(ctx)
	}
	return route{}
}

// sleepUntil sleeps for d, or until ctx ends; it reports whether ctx is
// still going.
func sleepUntil(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return ctx.Err() == nil
	case <-ctx.Done():
		return false
	}
}

// retryCause is why a call on a Cluster that failed with err is tried
// again, "" when it is not: err is an answer (a script's own error, a
// refused password, LATE), the caller's context ended, or the client gave
// up for its own reasons (a full queue, an exhausted pool), which a retry
// would only make worse. Every error with a cause but unreplicated and
// connection is a refusal: Redis did not run the command. Those two may
// have run it, which the scripts' idempotence makes safe to run again.
func retryCause(err error) string {
	if errors.Is(err, ErrNotReplicated) {
		return CauseUnreplicated
	}
	var reply redis.Error
	if errors.As(err, &reply) {
		for _, p := range refusals {
			if redis.HasErrorPrefix(err, p.prefix) {
				return p.cause
			}
		}
		return ""
	}
	var op *net.OpError
	switch {
	case errors.As(err, &op):
		return CauseConnection // a dial refused or timed out, a reset, a read that timed out
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return ""
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, redis.ErrClosed):
		return CauseConnection // a node that closed the connection; a node client closed on a layout change
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return CauseConnection
	}
	return ""
}

// refusals are the error replies of a Cluster node that did not run a
// command and would run it, or its new owner would, a little later.
var refusals = []struct{ prefix, cause string }{
	{"MOVED ", CauseMoved},
	{"ASK ", CauseAsk},
	{"TRYAGAIN", CauseTryAgain},
	{"CLUSTERDOWN", CauseClusterDown},
	{"LOADING", CauseLoading},
	{"READONLY", CauseReadOnly},
	{"MASTERDOWN", CauseMasterDown},
}
