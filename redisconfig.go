package redislock

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap/zapcore"

	"github.com/reqlock/caddy-redis-lock/internal/redisconn"
)

// Redis connection modes.
const (
	ModeStandalone = "standalone"
	ModeCluster    = "cluster"
	ModeSentinel   = "sentinel"
	ModeRedlock    = "redlock"
)

// Defaults of the Redis connection.
const (
	DefaultRedisAddress = "127.0.0.1:6379"
	DefaultDialTimeout  = redisconn.DefaultDialTimeout
	DefaultTimeout      = time.Second
)

// RedisConfig is the connection to Redis. Every string field may use global
// placeholders such as {env.REDIS_PASSWORD}; they are resolved at provision
// time, so secrets need not appear in the config.
type RedisConfig struct {
	// Addresses are host:port pairs. Default: ["127.0.0.1:6379"].
	Addresses []string `json:"addresses,omitempty"`
	// Mode is standalone (one server; Addresses holds it), sentinel (a
	// primary that Sentinels fail over; Addresses holds the Sentinels),
	// cluster (a Redis Cluster; Addresses holds some of its nodes) or
	// redlock (an odd number, at least 3, of independent masters, all in
	// Addresses). Default: standalone.
	Mode string `json:"mode,omitempty"`
	// MasterName is the Sentinel master name (sentinel mode).
	MasterName string `json:"master_name,omitempty"`
	// Username for Redis ACL authentication.
	Username string `json:"username,omitempty"`
	// Password for Redis authentication. Never printed or logged.
	Password string `json:"password,omitempty"`
	// SentinelUsername is the ACL user to authenticate to Sentinels as.
	SentinelUsername string `json:"sentinel_username,omitempty"`
	// SentinelPassword authenticates to Sentinels. Never printed or logged.
	SentinelPassword string `json:"sentinel_password,omitempty"`
	// DB is the database number. Default: 0.
	DB int `json:"db,omitempty"`
	// TLS, when present (even empty), connects with TLS.
	TLS *RedisTLS `json:"tls,omitempty"`
	// DialTimeout bounds establishing a connection. Default: 2s.
	DialTimeout caddy.Duration `json:"dial_timeout,omitempty"`
	// Timeout bounds each command (read and write). Default: 1s.
	Timeout caddy.Duration `json:"timeout,omitempty"`
	// PoolSize is the maximum number of connections. Default: go-redis's,
	// 10 per CPU.
	PoolSize int `json:"pool_size,omitempty"`
	// Replicas is how many replicas must acknowledge a lock, its renewals
	// and, in idempotency mode, a stored answer (Redis WAIT, within
	// Timeout), so that a failover that promotes one of them keeps them.
	// Not in redlock mode, whose masters have no replicas. Default: 0, do
	// not wait.
	Replicas int `json:"replicas,omitempty"`
}

// RedisTLS configures TLS to Redis.
type RedisTLS struct {
	// CA is a PEM file of the certificate authorities to trust. Default:
	// the system roots.
	CA string `json:"ca,omitempty"`
	// Cert and Key are PEM files of a client certificate.
	Cert string `json:"cert,omitempty"`
	Key  string `json:"key,omitempty"`
	// ServerName overrides the name checked in the server certificate.
	ServerName string `json:"server_name,omitempty"`
	// InsecureSkipVerify disables certificate verification (tests only).
	InsecureSkipVerify bool `json:"insecure_skip_verify,omitempty"`
}

// validate checks what can be checked before placeholders are resolved.
func (c *RedisConfig) validate() error {
	n := len(c.Addresses)
	switch c.Mode {
	case "", ModeStandalone:
		if n > 1 {
			return fmt.Errorf("standalone mode takes one address, got %d (several masters: mode redlock; a cluster: mode cluster)", n)
		}
	case ModeSentinel:
		if c.MasterName == "" {
			return fmt.Errorf("sentinel mode needs master_name")
		}
		if n == 0 {
			return fmt.Errorf("sentinel mode needs the Sentinels' addresses")
		}
	case ModeCluster:
		if n == 0 {
			return fmt.Errorf("cluster mode needs the address of at least one node")
		}
		if c.DB != 0 {
			return fmt.Errorf("cluster mode has only db 0, got %d", c.DB)
		}
	case ModeRedlock:
		if n < 3 || n%2 == 0 {
			return fmt.Errorf("redlock mode needs an odd number of independent masters, at least 3, got %d", n)
		}
	default:
		return fmt.Errorf("unknown redis mode %q (want standalone, cluster, sentinel or redlock)", c.Mode)
	}
	if c.Mode != ModeSentinel && (c.MasterName != "" || c.SentinelUsername != "" || c.SentinelPassword != "") {
		return fmt.Errorf("master_name, sentinel_username and sentinel_password are for sentinel mode")
	}
	if c.DB < 0 {
		return fmt.Errorf("db must not be negative, got %d", c.DB)
	}
	if c.DialTimeout < 0 || c.Timeout < 0 {
		return fmt.Errorf("timeouts must not be negative")
	}
	if c.PoolSize < 0 {
		return fmt.Errorf("pool_size must not be negative, got %d", c.PoolSize)
	}
	if c.Replicas < 0 {
		return fmt.Errorf("replicas must not be negative, got %d", c.Replicas)
	}
	if c.Replicas > 0 && c.Mode == ModeRedlock {
		return fmt.Errorf("replicas is not for redlock mode: its masters are independent, with no replicas to wait for (a lock counts once a majority of masters has it)")
	}
	if t := c.TLS; t != nil && (t.Cert == "") != (t.Key == "") {
		return fmt.Errorf("tls cert and key go together")
	}
	return nil
}

// resolve returns a copy with defaults applied and global placeholders
// ({env.X}, ...) replaced. It rejects what Provision cannot build.
func (c *RedisConfig) resolve() (*RedisConfig, error) {
	if c == nil {
		c = new(RedisConfig)
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	r := *c
	repl := caddy.NewReplacer()
	sub := func(s string) string { return repl.ReplaceKnown(s, "") }
	r.Addresses = make([]string, 0, len(c.Addresses))
	for _, a := range c.Addresses {
		r.Addresses = append(r.Addresses, sub(a))
	}
	if len(r.Addresses) == 0 {
		r.Addresses = []string{DefaultRedisAddress}
	}
	if r.Mode == "" {
		r.Mode = ModeStandalone
	}
	r.MasterName = sub(r.MasterName)
	r.Username = sub(r.Username)
	r.Password = sub(r.Password)
	r.SentinelUsername = sub(r.SentinelUsername)
	r.SentinelPassword = sub(r.SentinelPassword)
	if c.TLS != nil {
		t := *c.TLS
		t.CA, t.Cert, t.Key, t.ServerName = sub(t.CA), sub(t.Cert), sub(t.Key), sub(t.ServerName)
		r.TLS = &t
	}
	if r.DialTimeout == 0 {
		r.DialTimeout = caddy.Duration(DefaultDialTimeout)
	}
	if r.Timeout == 0 {
		r.Timeout = caddy.Duration(DefaultTimeout)
	}
	return &r, nil
}

// String describes the connection with secrets redacted.
func (c *RedisConfig) String() string {
	b, _ := json.Marshal(c.redacted())
	return string(b)
}

// MarshalLogObject logs the connection with secrets redacted.
func (c *RedisConfig) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	r := c.redacted()
	enc.AddString("mode", r.Mode)
	enc.AddString("addresses", fmt.Sprint(r.Addresses))
	enc.AddString("username", r.Username)
	enc.AddString("password", r.Password)
	enc.AddString("sentinel_username", r.SentinelUsername)
	enc.AddString("sentinel_password", r.SentinelPassword)
	enc.AddInt("db", r.DB)
	enc.AddBool("tls", r.TLS != nil)
	enc.AddDuration("dial_timeout", time.Duration(r.DialTimeout))
	enc.AddDuration("timeout", time.Duration(r.Timeout))
	enc.AddInt("pool_size", r.PoolSize)
	enc.AddInt("replicas", r.Replicas)
	return nil
}

// redacted is a copy whose secrets are replaced by "REDACTED".
func (c *RedisConfig) redacted() RedisConfig {
	if c == nil {
		return RedisConfig{}
	}
	r := *c
	if r.Password != "" {
		r.Password = "REDACTED"
	}
	if r.SentinelPassword != "" {
		r.SentinelPassword = "REDACTED"
	}
	return r
}

// poolKey identifies a resolved connection: handlers and config reloads with
// the same settings share one client. Secrets are in the key only as part of
// a hash.
func (c *RedisConfig) poolKey() string {
	b, _ := json.Marshal(c)
	sum := sha256.Sum256(b)
	return "redis_lock:" + hex.EncodeToString(sum[:])
}

var _ zapcore.ObjectMarshaler = (*RedisConfig)(nil)
