package main

import (
	"fmt"
	"io"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile" // the "caddyfile" adapter
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/reqlock/caddy-redis-lock" // the redis_lock directive
)

// demoPrefix keeps the demo's keys apart in an existing Redis (REDIS_ADDR).
const demoPrefix = "demo:redis_lock:"

// demoRetention is how long the idempotency route keeps a finished charge's
// response: the default is 24h, an hour keeps an existing Redis (REDIS_ADDR)
// tidy and is still long enough to try -serve by hand.
const demoRetention = "1h"

// caddySites are the three routes the storm hits, all in front of the backend.
type caddySites struct {
	PlainAddr      string // plain reverse_proxy
	LockedAddr     string // redis_lock + reverse_proxy
	IdempotentAddr string // redis_lock with idempotency + reverse_proxy
	AdminAddr      string // Caddy's admin endpoint (the redis_lock admin API)
	Backend        string
	Redis          string
	TTL            string // lease, a Caddy duration
}

// Caddyfile is the demo's configuration; -serve prints it, so a reader can
// copy the locked sites into their own Caddyfile.
func (s caddySites) Caddyfile() string {
	return fmt.Sprintf(`{
	admin %[9]s
	auto_https off
	persist_config off
	grace_period 2s
	log {
		level ERROR
	}
}

# The legacy way: every duplicate reaches the payment backend.
http://%[1]s {
	reverse_proxy %[3]s
}

# The same backend behind redis_lock: one request per Idempotency-Key at a
# time, duplicates get 409 and the backend gets a Fencing-Token header. A
# retry after the first request has finished is let through, and charged.
http://%[2]s {
	redis_lock {http.request.header.Idempotency-Key} {
		name locked
		ttl %[5]s
		prefix %[6]s
		redis %[4]s
	}
	reverse_proxy %[3]s
}

# redis_lock with idempotency: the same, and a finished request's response
# is stored under its key and replayed (Idempotent-Replayed: true) to a
# retry with the same key, method, path, query and body, which never
# reaches the backend.
http://%[7]s {
	redis_lock {http.request.header.Idempotency-Key} {
		name idempotent
		ttl %[5]s
		prefix %[6]s
		redis %[4]s
		idempotency {
			retention %[8]s
		}
	}
	reverse_proxy %[3]s
}
`, s.PlainAddr, s.LockedAddr, s.Backend, s.Redis, s.TTL, demoPrefix, s.IdempotentAddr, demoRetention, s.AdminAddr)
}

// startCaddy adapts caddyfile and runs it in this process; stop with
// caddy.Stop(). Adapter warnings are printed to warn.
func startCaddy(caddyfile string, warn io.Writer) error {
	adapter := caddyconfig.GetAdapter("caddyfile")
	if adapter == nil {
		return fmt.Errorf("caddy: no caddyfile adapter registered")
	}
	cfgJSON, warnings, err := adapter.Adapt([]byte(caddyfile), map[string]any{"filename": "demo.Caddyfile"})
	if err != nil {
		return fmt.Errorf("caddy: adapting the demo Caddyfile: %w", err)
	}
	for _, w := range warnings {
		fmt.Fprintf(warn, "caddy: warning: %s\n", w.String())
	}
	if err := caddy.Load(cfgJSON, true); err != nil {
		return fmt.Errorf("caddy: loading the demo config: %w", err)
	}
	return nil
}
