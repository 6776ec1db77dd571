package redislock

// Network faults between Caddy and Redis that a stopped or paused Redis does
// not produce: a stalled connection that delivers late, through a proxy
// (redistest.Proxy) that holds what is written on the connections open at
// the fault while new connections go through.

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

// A phantom lock after a partial partition: an acquire held on a stalled
// connection, given back on another one, and delivered after its give-back's
// mark expired (one lease), takes nothing: it carries its deadline on
// Redis's clock. The client gets 503 within its bound, and a retry after the
// heal runs, in both modes, and in Redlock mode with a majority of masters
// stalled.
func TestLateAcquireTakesNothing(t *testing.T) {
	t.Parallel()
	const (
		ttl    = 2 * time.Second
		window = 650 * time.Millisecond  // what is written meanwhile is held
		held   = 3500 * time.Millisecond // and delivered past the give-back's mark, a lease
	)
	srv, rdb := newRedis(t)
	masters := []*redistest.Server{redistest.Start(t), redistest.Start(t), redistest.Start(t)}
	be := chargeBackend(t)
	type mode struct {
		name    string
		opts    []siteOption
		proxies []*redistest.Proxy // held at the fault
		rdbs    []*redis.Client    // where the key must not be taken
		addr    string
	}
	modes := []*mode{
		{name: "lock", rdbs: []*redis.Client{rdb}},
		{name: "idempotency", opts: []siteOption{idempotent()}, rdbs: []*redis.Client{rdb}},
		{name: "redlock", opts: []siteOption{redisLines("mode redlock")}},
		{name: "redlock-idempotency", opts: []siteOption{redisLines("mode redlock"), idempotent()}},
	}
	bodies := make([]string, len(modes))
	for i, m := range modes {
		if strings.HasPrefix(m.name, "redlock") {
			addrs := []string{masters[2].Addr}
			for _, srv := range masters[:2] {
				p := redistest.StartProxy(t, srv.Addr)
				m.proxies = append(m.proxies, p)
				addrs = append(addrs, p.Addr)
				c := redis.NewClient(&redis.Options{Addr: srv.Addr})
				t.Cleanup(func() { c.Close() })
				m.rdbs = append(m.rdbs, c)
			}
			m.addr = strings.Join(addrs, " ")
		} else {
			p := redistest.StartProxy(t, srv.Addr)
			m.proxies, m.addr = []*redistest.Proxy{p}, p.Addr
		}
		opts := append([]siteOption{faultTimeouts, lockLines("ttl " + ttl.String())}, m.opts...)
		bodies[i] = paySite(m.addr, be.hostPort(), opts...)
	}
	sites := startCaddySites(t, siteOptions{}, bodies...)
	for i, m := range modes {
		s, key := sites[i], "late-"+m.name
		if r := s.do("POST", "/pay", `{}`, "Idempotency-Key", "warm-"+m.name); r.Status/100 != 2 {
			t.Fatalf("%s warm-up: %s", m.name, r)
		}
		for _, p := range m.proxies {
			p.Hold(window, held)
		}
		healed := time.Now().Add(held)
		sent := time.Now()
		r := s.do("POST", "/pay", `{}`, "Idempotency-Key", key)
		if d := time.Since(sent); d > 2*redisTimeout+slack {
			t.Errorf("%s: answered %v after it was sent, want at most 2 x timeout", m.name, d)
		}
		expectProblem(t, r, http.StatusServiceUnavailable)
		time.Sleep(time.Until(healed.Add(time.Second)))
		for _, c := range m.rdbs {
			if keyExists(t, c, defaultKey(key)) {
				t.Errorf("%s: the late acquire took the key on %s", m.name, c.Options().Addr)
			}
		}
		retry := s.do("POST", "/pay", `{}`, "Idempotency-Key", key)
		if retry.Status/100 != 2 {
			t.Errorf("%s: the retry a second after the heal: %s, want it run", m.name, retry)
		}
		if n := be.executions(key); n != 1 {
			t.Errorf("%s: backend ran %d times, want once", m.name, n)
		}
	}
}
