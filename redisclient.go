package redislock

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
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

// newClient builds the go-redis client for a resolved config. It does not
// connect: go-redis dials lazily and reconnects by itself.
func newClient(c *RedisConfig) (redis.UniversalClient, error) {
	tlsCfg, err := c.TLS.tlsConfig()
	if err != nil {
		return nil, err
	}
	rdb := redis.NewClient(&redis.Options{
		Addr:      c.Addresses[0],
		Username:  c.Username,
		Password:  c.Password,
		DB:        c.DB,
		TLSConfig: tlsCfg,
		PoolSize:  c.PoolSize,
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
	})
	// Concurrent requests' lock commands share write and read system calls
	// through go-redis's automatic pipelining, which costs Redis much less
	// CPU per request than one round trip per command (bench/README.md).
	// The deferred face, because a command queued in a pipeline is sent
	// whatever its context says: the lock library waits on each command's
	// future and gives up at its own deadline (lock.Config.CallTimeout).
	opt := redis.DefaultBlockingAutoPipelineOptions()
	// A Redis that stops answering must not queue commands without end:
	// past this many, a request gets 503 at once.
	opt.MaxQueuedCommands = maxQueuedCommands
	ap, err := rdb.AsyncAutoPipelineWithOptions(opt)
	if err != nil {
		rdb.Close()
		return nil, err
	}
	return pipelinedClient{ap, rdb}, nil
}

// maxQueuedCommands bounds the commands waiting in a client's pipeline.
const maxQueuedCommands = 10000

// pipelinedClient is the autopipeliner with a Close that closes the client
// underneath too (closing the autopipeliner alone leaves it open).
type pipelinedClient struct {
	*redis.AutoPipeliner
	base *redis.Client
}

func (p pipelinedClient) Close() error {
	return errors.Join(p.AutoPipeliner.Close(), p.base.Close())
}

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

// pooledClient is a client shared through clients. A config reload that
// changes the Redis settings retires it (Destruct), but requests of the old
// config may still hold locks taken through it: it stays open until the
// last of them is released.
type pooledClient struct {
	redis.UniversalClient
	mu       sync.Mutex
	inFlight int  // requests between hold and done
	retired  bool // Destruct was called
}

// hold marks a request that may take a lock through p; done must follow.
func (p *pooledClient) hold() {
	p.mu.Lock()
	p.inFlight++
	p.mu.Unlock()
}

// done ends a hold, closing a retired client after its last request.
func (p *pooledClient) done() {
	p.mu.Lock()
	p.inFlight--
	last := p.retired && p.inFlight == 0
	p.mu.Unlock()
	if last {
		_ = p.Close()
	}
}

// Destruct closes the client when its last user is cleaned up, or, while
// requests still hold it, when the last of them is done.
func (p *pooledClient) Destruct() error {
	p.mu.Lock()
	p.retired = true
	idle := p.inFlight == 0
	p.mu.Unlock()
	if idle {
		return p.Close()
	}
	return nil
}

// acquireClient returns the shared client for c and its pool key; every call
// must be matched by releaseClient(key).
func acquireClient(c *RedisConfig) (*pooledClient, string, error) {
	setGoRedisLogger.Do(func() { redis.SetLogger(goRedisLogger{caddy.Log().Named("redis_lock.go-redis")}) })
	key := c.poolKey()
	v, _, err := clients.LoadOrNew(key, func() (caddy.Destructor, error) {
		rdb, err := newClient(c)
		if err != nil {
			return nil, err
		}
		return &pooledClient{UniversalClient: rdb}, nil
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
