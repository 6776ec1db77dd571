// Command loadcaddy is the load test's Caddy: cmd/caddy's modules and the
// floor handler (internal/floor), which the load test measures beside
// redis_lock.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/reqlock/caddy-redis-lock"
	"github.com/reqlock/caddy-redis-lock/internal/floor"
)

func main() {
	floor.Register()
	caddycmd.Main()
}
