package redislock

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
)

// tlsConfig builds the client TLS configuration; nil without TLS.
func (t *RedisTLS) tlsConfig() (*tls.Config, error) {
	if t == nil {
		return nil, nil
	}
	cfg := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         t.ServerName,
		InsecureSkipVerify: t.InsecureSkipVerify, //nolint:gosec // opt-in, documented as tests only
	}
	if t.CA != "" {
		pem, err := os.ReadFile(t.CA)
		if err != nil {
			return nil, fmt.Errorf("reading redis tls ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("redis tls ca %s: no PEM certificates", t.CA)
		}
		cfg.RootCAs = pool
	}
	if t.Cert != "" {
		cert, err := tls.LoadX509KeyPair(t.Cert, t.Key)
		if err != nil {
			return nil, fmt.Errorf("loading redis tls client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// newBackend builds the lock backend of a resolved config, what tells when
// a server that failed is back, and what closes them. It does not connect:
// go-redis dials lazily and reconnects by itself.
func newBackend(c *RedisConfig) (engine.Backend, *redisBack, func() error, error) {
	tlsCfg, err := c.TLS.tlsConfig()
	if err != nil {
		return nil, nil, nil, err
	}
	opt := universalOptions(c, tlsCfg)
	back := newRedisBack()
	rd := newRedialer(opt, back)
	if c.Mode == ModeSentinel {
		rd.master = newSentinelMaster(opt)
	}
	opt.Dialer = rd.dial
	b, closeFn, err := newClients(c, opt, back)
	if err != nil {
		rd.close()
		return nil, nil, nil, err
	}
	return b, back, func() error { rd.close(); return closeFn() }, nil
}

// newClients builds the go-redis clients of c's mode with opt, and the lock
// backend on them.
func newClients(c *RedisConfig, opt *redis.UniversalOptions, back *redisBack) (engine.Backend, func() error, error) {
	switch c.Mode {
	case ModeSentinel:
		// A failover client follows the Sentinels' +switch-master and
		// reconnects to the new primary, with no restart. Its options have
		// no Limiter: the backoff is a hook there.
		rdb := redis.NewFailoverClient(opt.Failover())
		rdb.AddHook(newAuthBackoff(back))
		return pipelined(rdb, c)
	case ModeCluster:
		// The cluster client routes each script to the node of its keys'
		// slot (a lock, its counter and its record share one), and follows
		// MOVED and ASK redirects and failovers.
		co := opt.Cluster()
		// go-redis reloads the slot layout on MOVED, but not when the
		// master of a slot stops answering: without a short reload
		// interval (its default is a minute) the slots of a failed
		// master stay on it long after its replica took over.
		co.ClusterStateReloadInterval = time.Second
		co.NewClient = func(o *redis.Options) *redis.Client {
			o.Limiter = newAuthBackoff(back)
			return redis.NewClient(o)
		}
		return pipelined(redis.NewClusterClient(co), c)
	case ModeRedlock:
		var nodes []engine.Master
		var closers []func() error
		for _, addr := range c.Addresses {
			b, closeNode, err := pipelined(redis.NewClient(serverOptions(opt, addr, back)), c)
			if err != nil {
				return nil, nil, errors.Join(err, closeAll(closers)())
			}
			nodes, closers = append(nodes, b), append(closers, closeNode)
		}
		rl, err := engine.NewRedlockOf(nodes, c.Addresses)
		if err != nil {
			return nil, nil, errors.Join(err, closeAll(closers)())
		}
		return rl, closeAll(closers), nil
	}
	return pipelined(redis.NewClient(serverOptions(opt, c.Addresses[0], back)), c)
}

// universalOptions are the options every mode shares; go-redis derives
// each mode's own from them.
func universalOptions(c *RedisConfig, tlsCfg *tls.Config) *redis.UniversalOptions {
	return &redis.UniversalOptions{
		Addrs:            c.Addresses,
		MasterName:       c.MasterName,
		SentinelUsername: c.SentinelUsername,
		SentinelPassword: c.SentinelPassword,
		Username:         c.Username,
		Password:         c.Password,
		DB:               c.DB,
		TLSConfig:        tlsCfg,
		PoolSize:         c.PoolSize,
		// Request contexts bound every command; Timeout bounds the rest.
		ContextTimeoutEnabled: true,
		DialTimeout:           time.Duration(c.DialTimeout),
		ReadTimeout:           time.Duration(c.Timeout),
		WriteTimeout:          time.Duration(c.Timeout),
		// One retry rides out a dropped pooled connection; more, or
		// go-redis's default of 5 dial attempts 100ms apart, would only
		// delay the 503 while Redis is down (about 0.8s per request).
		// The lock commands are idempotent for their own token, so a retry
		// never applies twice.
		MaxRetries:    1,
		DialerRetries: 1,
	}
}

// redialer is the dialer of a backend's go-redis clients: their own
// dialer, except when a pool's probe calls it after an outage.
//
// After PoolSize failed dials since it last connected, a go-redis pool
// fails every new connection at once with the last dial error, and a
// background probe (internal/pool's tryDial) dials once a second until it
// connects; only then does the pool dial again. No option sets that
// interval (v9.23.0: the probe sleeps a fixed second after each failure).
// A node that saw Redis go away would so stay away for up to a second after
// Redis is back, and in idempotency mode a retry on another node could run
// a request again meanwhile, although its answer is on its way to Redis.
//
// Called from the probe, redialer keeps dialling, every redialInterval
// (each attempt bounded by DialTimeout), until a dial succeeds or the
// backend is closed, so the probe succeeds, and the pool takes new
// connections again, within redialInterval of Redis's return. The probe
// runs in a goroutine of its own: no request waits on it. Every other dial
// is a single attempt, as before: while Redis is down, commands still fail
// at once. The probe is told apart by its frame on the call stack, the one
// thing that tells it from the pool's other dials (their contexts and
// deadlines look the same); should go-redis rename or remove it, dials
// behave as go-redis's own again (TestRedialAfterRestartWithinBound fails).
//
// In Sentinel mode the address a dial is given is the master's when the
// dial began; a master that died stays dead. While the probe dials, the
// Sentinels are asked for the master every sentinelAskInterval, and the
// probe dials the one they name: after a failover the pool connects to
// the new master (go-redis's failover client resolves the address only
// when a dial begins, and its probe's one dial would never end).
type redialer struct {
	next    func(ctx context.Context, network, addr string) (net.Conn, error)
	timeout time.Duration   // each attempt of the probe's
	master  *sentinelMaster // Sentinel mode: who the master is now
	back    *redisBack      // told when the probe connects
	done    chan struct{}   // closed with the backend
	closed  sync.Once
}

// redialInterval is how often the pools' probe dials while Redis refuses.
const redialInterval = 25 * time.Millisecond

// probeSettle is how long after the probe connects the tries waiting for
// Redis are woken: the time the pool takes to count the probe's success.
const probeSettle = time.Millisecond

// sentinelAskInterval is how often the probe asks the Sentinels for the
// master while it cannot connect.
const sentinelAskInterval = 250 * time.Millisecond

// probeFrame is the function of go-redis's pool probe.
const probeFrame = "github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"

func newRedialer(opt *redis.UniversalOptions, back *redisBack) *redialer {
	// go-redis's own dialer, as it builds it when Options.Dialer is nil.
	timeout := opt.DialTimeout
	if timeout <= 0 {
		timeout = DefaultDialTimeout
	}
	next := redis.NewDialer(&redis.Options{DialTimeout: timeout, TLSConfig: opt.TLSConfig})
	return &redialer{next: next, timeout: timeout, back: back, done: make(chan struct{})}
}

func (r *redialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if !calledFrom(probeFrame) {
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
			time.AfterFunc(probeSettle, r.back.back)
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
		case <-time.After(redialInterval):
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

// sentinelMaster asks the Sentinels for the address of their master.
type sentinelMaster struct {
	name      string
	sentinels []*redis.SentinelClient
}

func newSentinelMaster(opt *redis.UniversalOptions) *sentinelMaster {
	m := &sentinelMaster{name: opt.MasterName}
	for _, a := range opt.Addrs {
		m.sentinels = append(m.sentinels, redis.NewSentinelClient(&redis.Options{
			Addr: a, Username: opt.SentinelUsername, Password: opt.SentinelPassword, TLSConfig: opt.TLSConfig,
			DialTimeout: opt.DialTimeout, ReadTimeout: opt.ReadTimeout, WriteTimeout: opt.WriteTimeout,
			PoolSize: 1, MaxRetries: -1, ContextTimeoutEnabled: true,
		}))
	}
	return m
}

// addr is the master's address by the first Sentinel that names it, each
// asked for at most timeout.
func (m *sentinelMaster) addr(timeout time.Duration) (string, error) {
	var errs []error
	for _, s := range m.sentinels {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		v, err := s.GetMasterAddrByName(ctx, m.name).Result()
		cancel()
		if err == nil && len(v) == 2 {
			return net.JoinHostPort(v[0], v[1]), nil
		}
		errs = append(errs, err)
	}
	return "", errors.Join(errs...)
}

func (m *sentinelMaster) close() {
	for _, s := range m.sentinels {
		_ = s.Close()
	}
}

// calledFrom reports whether fn is on the caller's stack (within 32 frames).
func calledFrom(fn string) bool {
	var pcs [32]uintptr
	frames := runtime.CallersFrames(pcs[:runtime.Callers(2, pcs[:])])
	for {
		f, more := frames.Next()
		if f.Function == fn {
			return true
		}
		if !more {
			return false
		}
	}
}

// serverOptions are the options of a client of the one server at addr.
func serverOptions(opt *redis.UniversalOptions, addr string, back *redisBack) *redis.Options {
	o := opt.Simple()
	o.Addr = addr
	o.Limiter = newAuthBackoff(back)
	return o
}

// authBackoff is go-redis's Limiter for one server: after Redis refused to
// authenticate a new connection (a wrong password, an unknown or disabled
// user), new connections are not tried for authBackoffFor, and commands
// fail at once. Without it every request dials, and is refused, on a
// connection of its own: thousands of connections a second, and as many
// sockets left in TIME_WAIT.
//
// As the one thing that sees every command's result on a server, it also
// tells back when the server answers again after a failure.
type authBackoff struct {
	until   atomic.Int64
	refusal atomic.Pointer[error] // Redis's answer, for the log
	health  serverHealth
}

func newAuthBackoff(back *redisBack) *authBackoff {
	return &authBackoff{health: serverHealth{b: back}}
}

// authBackoffFor is how long connections are not tried after a refusal.
const authBackoffFor = time.Second

func (b *authBackoff) Allow() error {
	if time.Now().UnixNano() < b.until.Load() {
		return fmt.Errorf("not connecting again for %v after Redis refused to authenticate: %w", authBackoffFor, *b.refusal.Load())
	}
	return nil
}

func (b *authBackoff) ReportResult(err error) {
	b.health.report(err)
	if err != nil && (redis.HasErrorPrefix(err, "WRONGPASS") || redis.HasErrorPrefix(err, "NOAUTH")) {
		b.refusal.Store(&err)
		b.until.Store(time.Now().Add(authBackoffFor).UnixNano())
	}
}

// As a go-redis Hook, for a client whose options take no Limiter (the
// Sentinel failover client): dials fail at once during the backoff, and
// command results report refusals.
func (b *authBackoff) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if err := b.Allow(); err != nil {
			return nil, err
		}
		return next(ctx, network, addr)
	}
}

func (b *authBackoff) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		b.ReportResult(err)
		return err
	}
}

func (b *authBackoff) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		b.ReportResult(err)
		return err
	}
}

// asyncPipeliner is a go-redis client that has a deferred autopipeliner.
type asyncPipeliner interface {
	redis.UniversalClient
	AsyncAutoPipelineWithOptions(*redis.AutoPipelineOptions) (*redis.AutoPipeliner, error)
}

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
func pipelined(rdb asyncPipeliner, c *RedisConfig) (engine.Master, func() error, error) {
	opt := redis.DefaultBlockingAutoPipelineOptions()
	// A Redis that stops answering must not queue commands without end:
	// past this many, a request gets 503 at once.
	opt.MaxQueuedCommands = maxQueuedCommands
	ap, err := rdb.AsyncAutoPipelineWithOptions(opt)
	if err != nil {
		return nil, nil, errors.Join(err, rdb.Close())
	}
	b := engine.NewPipelinedRedis(ap, rdb, engine.Replication{Replicas: c.Replicas, Timeout: time.Duration(c.Timeout)})
	return b, func() error { return errors.Join(ap.Close(), rdb.Close()) }, nil
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

// maxQueuedCommands bounds the commands waiting in a client's pipeline.
const maxQueuedCommands = 10000

// goRedisLogger sends go-redis's own messages (dial failures, ...) to Caddy's
// log instead of stderr. They are debug-level: the handler already warns
// about every request that Redis failed.
type goRedisLogger struct{ l *zap.Logger }

func (g goRedisLogger) Printf(_ context.Context, format string, v ...any) {
	if ce := g.l.Check(zapcore.DebugLevel, "go-redis"); ce != nil {
		ce.Write(zap.String("message", fmt.Sprintf(format, v...)))
	}
}

var setGoRedisLogger sync.Once

// clients shares Redis clients between handlers and config reloads.
var clients = caddy.NewUsagePool()

// pooledClient is a lock backend (and its clients) shared through clients.
// A config reload that changes the Redis settings retires it (Destruct), but
// requests of the old config may still hold locks taken through it: it
// stays open until the last of them is released.
type pooledClient struct {
	backend  engine.Backend
	back     *redisBack
	close    func() error
	inFlight atomic.Int64 // requests between hold and done
	retired  atomic.Bool  // Destruct was called
	closed   sync.Once
}

// hold marks a request that may take a lock through p; done must follow.
// Atomics, not a mutex: every request passes here twice.
func (p *pooledClient) hold() { p.inFlight.Add(1) }

// done ends a hold, closing a retired client after its last request.
func (p *pooledClient) done() {
	if p.inFlight.Add(-1) == 0 && p.retired.Load() {
		p.closeOnce()
	}
}

// Destruct closes the client when its last user is cleaned up, or, while
// requests still hold it, when the last of them is done.
func (p *pooledClient) Destruct() error {
	p.retired.Store(true)
	if p.inFlight.Load() == 0 {
		return p.closeOnce()
	}
	return nil
}

// closeOnce closes the client the first time it is called.
func (p *pooledClient) closeOnce() (err error) {
	p.closed.Do(func() { err = p.close() })
	return err
}

// acquireClient returns the shared client for c and its pool key; every call
// must be matched by releaseClient(key).
func acquireClient(c *RedisConfig) (*pooledClient, string, error) {
	setGoRedisLogger.Do(func() { redis.SetLogger(goRedisLogger{caddy.Log().Named("redis_lock.go-redis")}) })
	key := c.poolKey()
	v, _, err := clients.LoadOrNew(key, func() (caddy.Destructor, error) {
		b, back, closeFn, err := newBackend(c)
		if err != nil {
			return nil, err
		}
		return &pooledClient{backend: b, back: back, close: closeFn}, nil
	})
	if err != nil {
		return nil, "", err
	}
	return v.(*pooledClient), key, nil
}

func releaseClient(key string) error {
	_, err := clients.Delete(key)
	return err
}
