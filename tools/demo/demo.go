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
	Retries    int           // late retries per order, after the storm
	Delay      time.Duration // per charge at the backend
	TTL        time.Duration // redis_lock lease
	Embedded   bool          // use the in-process Redis even when redis-server is installed
	Serve      bool          // keep running after the report until ctx ends
	Timeout    time.Duration // per request
}

// routeResult is what one route did: the client's view of the storm and of
// the late retries, and the backend's ledger over the route's orders after
// each.
type routeResult struct {
	Config      stormConfig
	Storm       responses
	Late        responses
	StormLedger LedgerStats // after the storm
	Ledger      LedgerStats // after the late retries too
}

// Status is the number of answers with status code, in both waves.
func (r routeResult) Status(code int) int { return r.Storm.Statuses[code] + r.Late.Statuses[code] }

// Replayed is the number of answers replayed from a stored response.
func (r routeResult) Replayed() int { return r.Storm.Replayed + r.Late.Replayed }

// outcome is what a demo run measured, for the exit status and for tests.
type outcome struct {
	Redis      redisKind
	Plain      routeResult
	Locked     routeResult // redis_lock alone
	Idempotent routeResult // redis_lock with idempotency
	Ledger     *Ledger
}

// ok is the demo's verdict: the lock-only route let no double charge
// through the storm and answered it with 200 or 409 only (its late retries
// are charged again: that is what the demo shows), and the idempotency route
// let no double charge through at all and answered every request, storm
// and late retries alike, with 200 (a charge or its replay) or 409.
func (o outcome) ok() bool {
	l, i := o.Locked, o.Idempotent
	return l.StormLedger.DoubleCharges == 0 && l.Storm.onlyOKOrConflict() &&
		i.Ledger.DoubleCharges == 0 && i.Storm.onlyOKOrConflict() && i.Late.onlyOKOrConflict()
}

// runDemo starts Redis, the backend and Caddy, fires the storm and then the
// late retries at each route and prints the report to out. Everything it
// started is stopped before it returns, also when ctx is cancelled (Ctrl-C).
func runDemo(ctx context.Context, opt options, out io.Writer) (*outcome, error) {
	fmt.Fprintf(out, "caddy-redis-lock demo: %d orders x %d duplicate charges fired at once at three Caddy routes,\n"+
		"then %d late retries per order, as an SDK sends after a timeout\n\n",
		opt.Orders, opt.Duplicates, opt.Retries)

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
	fmt.Fprintf(out, "Backend:  demo payment ledger at http://%s/charge (each charge takes %v, like a slow gateway; no idempotency of its own)\n",
		backend.Addr, opt.Delay)

	sites, err := newSites(backend.Addr, rds.Addr, opt.TTL)
	if err != nil {
		return nil, err
	}
	if err := startCaddy(sites.Caddyfile(), out); err != nil {
		return nil, err
	}
	defer caddy.Stop() //nolint:errcheck // nothing to do about a failed stop at exit
	fmt.Fprintf(out, "Caddy:    plain reverse_proxy on http://%s, redis_lock on http://%s, redis_lock + idempotency on http://%s\n\n",
		sites.PlainAddr, sites.LockedAddr, sites.IdempotentAddr)

	run := fmt.Sprintf("%04x", rand.N(1<<16)) // an existing Redis may hold keys of an earlier run
	progress := newProgressLine(out)
	route := func(name, addr, id string) (routeResult, error) {
		cfg := stormConfig{
			Name: name, URL: "http://" + addr + "/charge", RunID: id + "-" + run,
			Orders: opt.Orders, Duplicates: opt.Duplicates, Retries: opt.Retries, Timeout: opt.Timeout,
		}
		res := routeResult{Config: cfg, Late: responses{Statuses: map[int]int{}}}
		res.Storm = runStorm(ctx, cfg, progress)
		res.StormLedger = ledger.Stats(cfg.orderIDs())
		if err := ctx.Err(); err != nil {
			return res, err
		}
		if cfg.Retries > 0 {
			res.Late = runLateRetries(ctx, cfg, progress)
		}
		res.Ledger = ledger.Stats(cfg.orderIDs())
		return res, ctx.Err()
	}
	fmt.Fprintln(out, "Firing the storm at each route, then the late retries once it has been answered:")
	o := &outcome{Redis: rds.Kind, Ledger: ledger}
	if o.Plain, err = route("plain reverse_proxy", sites.PlainAddr, "plain"); err != nil {
		return o, err
	}
	if o.Locked, err = route("redis_lock", sites.LockedAddr, "locked"); err != nil {
		return o, err
	}
	if o.Idempotent, err = route("redis_lock + idempotency", sites.IdempotentAddr, "idem"); err != nil {
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

// newSites picks free loopback ports for the three Caddy sites and the
// admin endpoint.
func newSites(backend, redis string, ttl time.Duration) (caddySites, error) {
	var ports [4]int
	for i := range ports {
		p, err := redistest.FreePort()
		if err != nil {
			return caddySites{}, err
		}
		ports[i] = p
	}
	return caddySites{
		PlainAddr:      "127.0.0.1:" + strconv.Itoa(ports[0]),
		LockedAddr:     "127.0.0.1:" + strconv.Itoa(ports[1]),
		IdempotentAddr: "127.0.0.1:" + strconv.Itoa(ports[2]),
		AdminAddr:      "127.0.0.1:" + strconv.Itoa(ports[3]),
		Backend:        backend, Redis: redis, TTL: ttl.String(),
	}, nil
}
