// Package redisconn is the connection to one Redis deployment, from its
// opening to its close, and its recovery after an outage: the go-redis
// clients of each mode (standalone, Sentinel, Cluster, Redlock) with the
// lock backend on them, the dialer that reconnects within RedialInterval
// once Redis answers again, and Recovery, which tells when it does. A Conn
// is shared: its users hold it while they may use it, and once retired it
// closes after the last hold ends. It knows nothing of Caddy.
package redisconn

import (
	"sync"
	"sync/atomic"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
)

// Conn is an open connection to Redis: the lock backend on the go-redis
// clients of its mode, and its Recovery. Opening it connects to nothing:
// go-redis dials lazily and reconnects by itself.
//
// A Conn that is retired (Destruct: its settings went out of use) may still
// be held by requests that took locks through it: it closes when the last
// of them lets go.
type Conn struct {
	backend  engine.Backend
	recovery *Recovery
	close    func() error
	unhold   func()       // Hold's, made once: a hold allocates nothing
	holds    atomic.Int64 // holds not yet ended
	retired  atomic.Bool  // Destruct was called
	closed   sync.Once
}

// Open opens the connection o describes, without contacting Redis.
func Open(o Options) (*Conn, error) {
	tlsCfg, err := o.TLS.config()
	if err != nil {
		return nil, err
	}
	opt := o.universal(tlsCfg)
	rec := newRecovery()
	rd := newRedialer(opt, rec)
	if o.Mode == Sentinel {
		rd.master = newSentinelMaster(opt)
	}
	opt.Dialer = rd.dial
	b, closeClients, err := newClients(&o, opt, rec)
	if err != nil {
		rd.close()
		return nil, err
	}
	c := &Conn{backend: b, recovery: rec, close: func() error { rd.close(); return closeClients() }}
	c.unhold = c.endHold
	return c, nil
}

// Backend is the lock backend on c's clients.
func (c *Conn) Backend() engine.Backend { return c.backend }

// Recovery tells when Redis recovers after an outage.
func (c *Conn) Recovery() *Recovery { return c.recovery }

// Hold keeps c open until unhold is called, which must be exactly once: a
// request holds it from before its acquire until its lock is given back,
// including the work that goes on in the background. Atomics, not a mutex:
// every request passes here.
func (c *Conn) Hold() (unhold func()) {
	c.holds.Add(1)
	return c.unhold
}

// endHold ends a hold, closing a retired c after its last one.
func (c *Conn) endHold() {
	if c.holds.Add(-1) == 0 && c.retired.Load() {
		_ = c.closeOnce()
	}
}

// Destruct retires c: it closes now, or, while it is held, when the last
// hold ends. (As a caddy.Destructor, when its last user is cleaned up.)
func (c *Conn) Destruct() error {
	c.retired.Store(true)
	if c.holds.Load() == 0 {
		return c.closeOnce()
	}
	return nil
}

// closeOnce closes c's clients the first time it is called.
func (c *Conn) closeOnce() (err error) {
	c.closed.Do(func() { err = c.close() })
	return err
}
