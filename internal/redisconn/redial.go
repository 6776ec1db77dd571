package redisconn

import (
	"context"
	"net"
	"runtime"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// redialer is the dialer of a Conn's go-redis clients: their own dialer,
// except when a pool's probe calls it after an outage.
//
// After PoolSize failed dials since it last connected, a go-redis pool
// fails every new connection at once with the last dial error, and a
// background probe dials once a second until it connects; only then does
// the pool dial again. No option sets that interval: the probe sleeps a
// fixed second after each failure. A node that saw Redis go away would so
// stay away for up to a second after Redis recovered, and in idempotency
// mode a retry on another node could run a request again meanwhile,
// although its answer is on its way to Redis.
//
// Called from the probe, redialer keeps dialling, every RedialInterval
// (each attempt bounded by DialTimeout), until a dial succeeds or the Conn
// is closed, so the probe succeeds, and the pool takes new connections
// again, within RedialInterval of Redis's recovery, which it then tells
// (Recovery). The probe runs in a goroutine of its own: no request waits on
// it. Every other dial is a single attempt: while Redis is down, commands
// fail at once. How the probe is told apart: isProbe.
//
// In Sentinel mode the address a dial is given is the master's when the
// dial began; a master that died stays dead. While the probe dials, the
// Sentinels are asked for the master every sentinelAskInterval, and the
// probe dials the one they name: after a failover the pool connects to
// the new master (go-redis's failover client resolves the address only
// when a dial begins, and its probe's one dial would never end).
type redialer struct {
	next     func(ctx context.Context, network, addr string) (net.Conn, error)
	timeout  time.Duration   // each attempt of the probe's
	master   *sentinelMaster // Sentinel mode: who the master is now
	recovery *Recovery       // told when the probe connects
	done     chan struct{}   // closed with the Conn
	closed   sync.Once
}

// RedialInterval is how often the pools' probe dials while Redis refuses.
const RedialInterval = 25 * time.Millisecond

// probeSettle is how long after the probe connects the tries waiting for
// Redis are woken: the time the pool takes to count the probe's success.
const probeSettle = time.Millisecond

// sentinelAskInterval is how often the probe asks the Sentinels for the
// master while it cannot connect.
const sentinelAskInterval = 250 * time.Millisecond

func newRedialer(opt *redis.UniversalOptions, rec *Recovery) *redialer {
	// go-redis's own dialer, as it builds it when Options.Dialer is nil.
	timeout := opt.DialTimeout
	if timeout <= 0 {
		timeout = DefaultDialTimeout
	}
	next := redis.NewDialer(&redis.Options{DialTimeout: timeout, TLSConfig: opt.TLSConfig})
	return &redialer{next: next, timeout: timeout, recovery: rec, done: make(chan struct{})}
}

func (r *redialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if !isProbe() {
		return r.next(ctx, network, addr)
	}
	var asked time.Time
	for {
		actx, cancel := context.WithTimeout(context.Background(), r.timeout)
		c, err := r.next(actx, network, addr)
		cancel()
		if err == nil {
			// Once the probe has returned: the pool takes new
			// connections again only then (it resets its count of
			// failed dials), and a try woken before would fail at once.
			time.AfterFunc(probeSettle, r.recovery.recovered)
			return c, nil
		}
		if r.master != nil && time.Since(asked) >= sentinelAskInterval {
			asked = time.Now()
			if now, err := r.master.addr(r.timeout); err == nil {
				addr = now
			}
		}
		select {
		case <-r.done:
			return nil, err
		case <-time.After(RedialInterval):
		}
	}
}

// close ends a probe's dialling: the pool's probe then ends with its pool.
func (r *redialer) close() {
	r.closed.Do(func() {
		close(r.done)
		if r.master != nil {
			r.master.close()
		}
	})
}

// probeFrame is the function of go-redis's pool probe.
const probeFrame = "github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"

// isProbe reports whether the dial that calls it is a pool's probe: whether
// the probe's function is on its call stack (within 32 frames).
//
// Nothing else tells it apart. go-redis gives a dial, through
// Options.Dialer and a Hook's DialHook alike, only a context, a network
// and an address, the same for every pool of a client; a pool dials for
// a request on context.WithCancel(context.Background()), not on the
// request's context, and the probe on context.Background(), each with
// DialTimeout and no values. OnConnect runs after a dial, and never for
// the probe's, which is closed unused. A Limiter is asked before a
// command takes a connection, not before the dial that follows. The
// pool's hooks (pool.PoolHook) and its count of failed dials are in its
// internal package, out of reach, and none of its options acts on the
// probe alone. Counting failed dials to know when the pool gave up would
// count the dials of the client's Pub/Sub pool too (a waiter's
// subscription), and take a dial that began before the pool gave up for
// the probe.
//
// Should go-redis rename or remove the probe's function, dials behave as
// go-redis's own again, and TestRedialAfterRestartWithinBound fails.
func isProbe() bool {
	var pcs [32]uintptr
	frames := runtime.CallersFrames(pcs[:runtime.Callers(2, pcs[:])])
	for {
		f, more := frames.Next()
		if f.Function == probeFrame {
			return true
		}
		if !more {
			return false
		}
	}
}
