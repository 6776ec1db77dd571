// Command demo shows what redis_lock does against double charges: it starts
// Redis, a slow demo payment backend with no idempotency of its own and
// Caddy with three routes to it (a plain reverse_proxy, one behind
// redis_lock, one behind redis_lock with idempotency), fires the same storm
// of concurrent duplicate charges at each and then, once the storm has been
// answered, a wave of late retries, and reports what the backend's ledger
// recorded. Run it with `make demo` (`make demo ARGS=-serve` to keep it
// running and try it with curl). It exits 0 only when the redis_lock route
// let no double charge through the storm and the idempotency route let none
// through at all.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	var opt options
	flag.IntVar(&opt.Orders, "orders", 20, "orders in the storm")
	flag.IntVar(&opt.Duplicates, "duplicates", 10, "concurrent charges per order")
	flag.IntVar(&opt.Retries, "retries", 3, "late retries per order, sent one after another once the storm has been answered")
	flag.DurationVar(&opt.Delay, "delay", 300*time.Millisecond, "how long the backend takes per charge")
	flag.DurationVar(&opt.TTL, "ttl", 10*time.Second, "redis_lock lease (ttl)")
	flag.DurationVar(&opt.Timeout, "timeout", 20*time.Second, "per request timeout")
	flag.BoolVar(&opt.Embedded, "embedded", false, "use the embedded Redis-protocol server even when redis-server is installed")
	flag.BoolVar(&opt.Serve, "serve", false, "keep running after the report and print curl commands to try")
	flag.Parse()
	if opt.Orders < 1 || opt.Duplicates < 1 || opt.Retries < 0 {
		fmt.Fprintln(os.Stderr, "demo: -orders and -duplicates must be at least 1, -retries at least 0")
		os.Exit(2)
	}

	// Ctrl-C cancels ctx; runDemo then stops Redis, the backend and Caddy.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	o, err := runDemo(ctx, opt, os.Stdout)
	stop()
	switch {
	case errors.Is(err, context.Canceled):
		fmt.Fprintln(os.Stderr, "demo: interrupted; Caddy, the backend and Redis are stopped")
		os.Exit(130)
	case err != nil:
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	case !o.ok():
		os.Exit(1)
	}
}
