// Command demo shows redis_lock stopping double charges: it starts Redis, a
// slow demo payment backend and Caddy with two routes to it (a plain
// reverse_proxy and one behind redis_lock), fires the same storm of
// concurrent duplicate charges at both and reports what the backend's ledger
// recorded. Run it with `make demo` (`make demo ARGS=-serve` to keep it
// running and try it with curl). It exits 0 only when the locked route let
// no double charge through.
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
	flag.DurationVar(&opt.Delay, "delay", 300*time.Millisecond, "how long the backend takes per charge")
	flag.DurationVar(&opt.TTL, "ttl", 10*time.Second, "redis_lock lease (ttl)")
	flag.DurationVar(&opt.Timeout, "timeout", 20*time.Second, "per request timeout")
	flag.BoolVar(&opt.Embedded, "embedded", false, "use the embedded Redis-protocol server even when redis-server is installed")
	flag.BoolVar(&opt.Serve, "serve", false, "keep running after the report and print curl commands to try")
	flag.Parse()
	if opt.Orders < 1 || opt.Duplicates < 1 {
		fmt.Fprintln(os.Stderr, "demo: -orders and -duplicates must be at least 1")
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
