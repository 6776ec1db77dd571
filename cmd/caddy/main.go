// Command caddy is Caddy with the standard modules and the redis_lock
// handler, for `go run ./cmd/caddy run --config Caddyfile.example`.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/reqlock/caddy-redis-lock"
)

func main() {
	caddycmd.Main()
}
