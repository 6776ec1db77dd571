package redisconn

import (
	"context"
	"errors"
	"net"
	"time"

	"github.com/redis/go-redis/v9"
)

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
