package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

// options are the demo's flags.
type options struct {
	Orders     int
	Duplicates int
	Delay      time.Duration // per charge at the backend
	TTL        time.Duration // redis_lock lease
	Embedded   bool          // use the in-process Redis even when redis-server is installed
	Serve      bool          // keep running after the report until ctx ends
	Timeout    time.Duration // per storm request
}

// outcome is what a demo run measured, for the exit status and for tests.
type outcome struct {
	Redis  redisKind
	Plain  stormResult
	Locked stormResult
	Ledger *Ledger
}

// ok is the demo's verdict: the locked route let no double charge through
// and answered every request with 200 or 409.
func (o outcome) ok() bool {
	l := o.Locked
	return l.Errors == 0 && l.Ledger.DoubleCharges == 0 &&
		l.Statuses[200]+l.Statuses[409] == l.Requests()
}

// runDemo starts Redis, the backend and Caddy, fires the storm at both
// routes and prints the report to out. Everything it started is stopped
// before it returns, also when ctx is cancelled (Ctrl-C).
func runDemo(ctx context.Context, opt options, out io.Writer) (*outcome, error) {
	fmt.Fprintf(out, "caddy-redis-lock demo: %d orders x %d duplicate charges, fired at once at two Caddy routes\n\n",
		opt.Orders, opt.Duplicates)

	rds, err := startRedis(opt.Embedded)
	if err != nil {
		return nil, err
	}
	defer rds.Close()
	fmt.Fprintf(out, "Redis:    %s\n", rds.About)

	ledger := NewLedger(opt.Delay)
	backend, err := startBackend(ledger)
	if err != nil {
		return nil, err
	}
	defer backend.Close()
	fmt.Fprintf(out, "Backend:  demo payment ledger at http://%s/charge (each charge takes %v, like a slow gateway)\n",
		backend.Addr, opt.Delay)

	sites, err := newSites(backend.Addr, rds.Addr, opt.TTL)
	if err != nil {
		return nil, err
	}
	if err := startCaddy(sites.Caddyfile(), out); err != nil {
		return nil, err
	}
	defer caddy.Stop() //nolint:errcheck // nothing to do about a failed stop at exit
	fmt.Fprintf(out, "Caddy:    plain reverse_proxy on http://%s, redis_lock on http://%s\n\n",
		sites.PlainAddr, sites.LockedAddr)

	run := fmt.Sprintf("%04x", rand.N(1<<16)) // an existing Redis may hold keys of an earlier run
	progress := newProgressLine(out)
	storm := func(name, addr, route string) stormResult {
		res := runStorm(ctx, stormConfig{
			Name: name, URL: "http://" + addr + "/charge", RunID: route + "-" + run,
			Orders: opt.Orders, Duplicates: opt.Duplicates, Timeout: opt.Timeout,
		}, progress)
		res.Ledger = ledger.Stats(res.Config.orderIDs())
		return res
	}
	fmt.Fprintln(out, "Firing the storm:")
	o := &outcome{Redis: rds.Kind, Ledger: ledger}
	o.Plain = storm("plain reverse_proxy", sites.PlainAddr, "plain")
	if err := ctx.Err(); err != nil {
		return o, err
	}
	o.Locked = storm("redis_lock", sites.LockedAddr, "locked")
	if err := ctx.Err(); err != nil {
		return o, err
	}
	fmt.Fprintln(out)
	writeReport(out, *o)

	if opt.Serve {
		printTryIt(out, sites, backend.Addr)
		<-ctx.Done()
		fmt.Fprintln(out, "\nstopping: Caddy, the backend and Redis")
	}
	return o, nil
}

// newSites picks free loopback ports for the two Caddy sites.
func newSites(backend, redis string, ttl time.Duration) (caddySites, error) {
	plain, err := redistest.FreePort()
	if err != nil {
		return caddySites{}, err
	}
	locked, err := redistest.FreePort()
	if err != nil {
		return caddySites{}, err
	}
	return caddySites{
		PlainAddr:  "127.0.0.1:" + strconv.Itoa(plain),
		LockedAddr: "127.0.0.1:" + strconv.Itoa(locked),
		Backend:    backend, Redis: redis, TTL: ttl.String(),
	}, nil
}
