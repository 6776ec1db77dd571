package redislock

// Caddy events through the events app, received by a subscribed handler:
// redis_unavailable, lock_lost and outcome_unknown, their data and origin,
// their rate limit, and a client's answer that does not wait for them.

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"

	"github.com/reqlock/caddy-redis-lock/internal/redistest"
	"github.com/reqlock/caddy-redis-lock/record"
)

// eventSink is an events handler for the tests: every event it gets goes
// to sunk. Its Handle takes a second, as a slow subscriber might.
type eventSink struct{}

var sunk = make(chan caddy.Event, 64)

func (eventSink) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "events.handlers.redis_lock_test_sink", New: func() caddy.Module { return new(eventSink) }}
}

func (eventSink) Handle(_ context.Context, e caddy.Event) error {
	time.Sleep(time.Second)
	sunk <- e
	return nil
}

func (eventSink) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next()
	return nil
}

func init() { caddy.RegisterModule(eventSink{}) }

var _ caddyevents.Handler = eventSink{}

// nextEvent waits for the next event of name, skipping others.
func nextEvent(t *testing.T, name string) caddy.Event {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case e := <-sunk:
			if e.Name() == name {
				return e
			}
		case <-deadline:
			t.Fatalf("no %s event within 10s", name)
		}
	}
}

func TestEvents(t *testing.T) {
	t.Parallel()
	srv, rdb := newRedis(t)
	down := mustFreePort(t) // nothing listens there
	be := chargeBackend(t)
	global := `events {
		on redis_unavailable redis_lock_test_sink
		on lock_lost redis_lock_test_sink
		on outcome_unknown redis_lock_test_sink
	}`
	sites := startCaddySites(t, siteOptions{global: global},
		paySite(srv.Addr, be.URL, storedAnswers(), lockLines("ttl 1s")),
		paySite(fmt.Sprintf("127.0.0.1:%d", down), be.URL, faultTimeouts))

	// redis_unavailable: the 503 comes at once, though the subscriber
	// takes a second; then one event, the second one within the second
	// held back and counted in the next.
	start := time.Now()
	expectProblem(t, sites[1].do("POST", "/pay", `{}`, "Idempotency-Key", "down-1"), http.StatusServiceUnavailable)
	if took := time.Since(start); took > 900*time.Millisecond {
		t.Errorf("the 503 took %v: the event held the answer back", took)
	}
	expectProblem(t, sites[1].do("POST", "/pay", `{}`, "Idempotency-Key", "down-2"), http.StatusServiceUnavailable)
	e := nextEvent(t, eventRedisUnavailable)
	if got := e.Origin().CaddyModule().ID; got != "http.handlers.redis_lock" {
		t.Errorf("origin %s, want the handler", got)
	}
	if d := e.Data; d["redis_key"] != defaultKey("down-1") || d["record_key"] != "" || d["result"] != resultUnavailable || d["fencing_token"] != int64(0) {
		t.Errorf("redis_unavailable data %v", d)
	}
	time.Sleep(1100 * time.Millisecond)
	expectProblem(t, sites[1].do("POST", "/pay", `{}`, "Idempotency-Key", "down-3"), http.StatusServiceUnavailable)
	if e := nextEvent(t, eventRedisUnavailable); e.Data["redis_key"] != defaultKey("down-3") || e.Data["suppressed"] != 1 {
		t.Errorf("the next redis_unavailable: %v, want down-3 with suppressed 1", e.Data)
	}

	// outcome_unknown: a backend that broke off; counted too.
	unknownBefore := counterValue(t, metrics.unknown)
	expectProblem(t, sites[0].do("POST", "/pay/reset", `{}`, "Idempotency-Key", "reset"), http.StatusBadGateway)
	e = nextEvent(t, eventOutcomeUnknown)
	if got := counterValue(t, metrics.unknown); got != unknownBefore+1 {
		t.Errorf("outcomes_unknown_total %v -> %v, want +1", unknownBefore, got)
	}
	if d := e.Data; d["redis_key"] != defaultKey("reset") || d["record_key"] != record.Key(defaultKey("reset")) || d["result"] != resultAcquired {
		t.Errorf("outcome_unknown data %v", d)
	} else if f, _ := d["fencing_token"].(int64); f <= 0 {
		t.Errorf("outcome_unknown without a fencing token: %v", d)
	}

	// lock_lost: the lock deleted under a request in flight.
	done := make(chan *response, 1)
	go func() { done <- sites[0].do("POST", "/pay/slow", `{}`, "Idempotency-Key", "lost") }()
	redistest.Eventually(t, 5*time.Second, "the lock taken", func() bool { return keyExists(t, rdb, defaultKey("lost")) })
	rdb.Del(context.Background(), defaultKey("lost"))
	<-done
	e = nextEvent(t, eventLockLost)
	if d := e.Data; d["redis_key"] != defaultKey("lost") || d["result"] != resultLost {
		t.Errorf("lock_lost data %v", d)
	}
}
