package redislock

import (
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/reqlock/caddy-redis-lock/internal/redisconn"
)

// conns shares Redis connections between handlers and config reloads: one
// per resolved settings (poolKey). A reload that changes the settings
// retires the old one (its Destruct), which stays open until the last
// request holding it lets go.
var conns = caddy.NewUsagePool()

var setGoRedisLogger sync.Once

// acquireConn returns the shared connection for c, a resolved config, and
// its pool key; every call must be matched by releaseConn(key). It does not
// contact Redis.
func acquireConn(c *RedisConfig) (*redisconn.Conn, string, error) {
	setGoRedisLogger.Do(func() { redisconn.SetLogger(caddy.Log().Named("redis_lock.go-redis")) })
	key := c.poolKey()
	v, _, err := conns.LoadOrNew(key, func() (caddy.Destructor, error) {
		conn, err := redisconn.Open(c.connOptions())
		if err != nil {
			return nil, err
		}
		return conn, nil
	})
	if err != nil {
		return nil, "", err
	}
	return v.(*redisconn.Conn), key, nil
}

// releaseConn gives back a connection acquireConn returned: the last user
// retires it.
func releaseConn(key string) error {
	_, err := conns.Delete(key)
	return err
}

// connOptions are the connection options of c, a resolved config.
func (c *RedisConfig) connOptions() redisconn.Options {
	o := redisconn.Options{
		Mode:             connModes[c.Mode],
		Addresses:        c.Addresses,
		MasterName:       c.MasterName,
		Username:         c.Username,
		Password:         c.Password,
		SentinelUsername: c.SentinelUsername,
		SentinelPassword: c.SentinelPassword,
		DB:               c.DB,
		DialTimeout:      time.Duration(c.DialTimeout),
		Timeout:          time.Duration(c.Timeout),
		PoolSize:         c.PoolSize,
		Replicas:         c.Replicas,
		OnRetry:          observeRetry,
	}
	if t := c.TLS; t != nil {
		o.TLS = &redisconn.TLS{CA: t.CA, Cert: t.Cert, Key: t.Key, ServerName: t.ServerName, InsecureSkipVerify: t.InsecureSkipVerify}
	}
	return o
}

// connModes are the connection modes of the config's.
var connModes = map[string]redisconn.Mode{
	ModeStandalone: redisconn.Standalone,
	ModeSentinel:   redisconn.Sentinel,
	ModeCluster:    redisconn.Cluster,
	ModeRedlock:    redisconn.Redlock,
}
