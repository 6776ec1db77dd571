package redisconn

import (
	"crypto/tls"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/caddy-redis-lock/internal/redisscript"
)

// Mode is how the Redis deployment is reached.
type Mode int

// The modes.
const (
	Standalone Mode = iota // one server, Addresses[0]
	Sentinel               // a primary that Sentinels fail over; Addresses are the Sentinels
	Cluster                // a Redis Cluster; Addresses are some of its nodes
	Redlock                // independent masters, all in Addresses
)

// DefaultDialTimeout bounds a dial when Options.DialTimeout is not set.
const DefaultDialTimeout = 2 * time.Second

// Options are a Conn's settings: the Redis config, resolved (defaults
// applied, placeholders replaced) and validated by its caller.
type Options struct {
	Mode       Mode
	Addresses  []string
	MasterName string // Sentinel mode

	Username, Password                 string
	SentinelUsername, SentinelPassword string
	DB                                 int

	TLS *TLS // nil: no TLS

	DialTimeout time.Duration // each dial; default DefaultDialTimeout
	Timeout     time.Duration // each command's read and write
	PoolSize    int           // 0: go-redis's default
	Replicas    int           // replicas that acknowledge each write (WAIT)

	// OnRetry is told of each call that a Cluster did not run and that is
	// tried again, with its cause (redisscript's Causes), and of each one
	// whose deadline passed meanwhile (exhausted). Not part of the
	// settings: nil, or the same function, for every Conn.
	OnRetry redisscript.RetryObserver
}

// universal are the go-redis options every mode shares; go-redis derives
// each mode's own from them.
func (o *Options) universal(tlsCfg *tls.Config) *redis.UniversalOptions {
	return &redis.UniversalOptions{
		Addrs:            o.Addresses,
		MasterName:       o.MasterName,
		SentinelUsername: o.SentinelUsername,
		SentinelPassword: o.SentinelPassword,
		Username:         o.Username,
		Password:         o.Password,
		DB:               o.DB,
		TLSConfig:        tlsCfg,
		PoolSize:         o.PoolSize,
		// Request contexts bound every command; Timeout bounds the rest.
		ContextTimeoutEnabled: true,
		DialTimeout:           o.DialTimeout,
		ReadTimeout:           o.Timeout,
		WriteTimeout:          o.Timeout,
		// One retry rides out a dropped pooled connection; more, or
		// go-redis's default of 5 dial attempts 100ms apart, would only
		// delay the 503 while Redis is down (about 0.8s per request).
		// The lock commands are idempotent for their own token, so a retry
		// never applies twice. On a Cluster, whose slots move and fail
		// over, a call is tried again until its deadline beside these
		// (redisscript's retry): go-redis's budgets are counts
		// (MaxRedirects, 3 by default, spent in tens of milliseconds).
		MaxRetries:    1,
		DialerRetries: 1,
	}
}
