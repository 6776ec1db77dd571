package redislock

// A slow link between Caddy and Redis (redistest.Proxy's Throttle): a large
// answer takes longer to reach Redis than the redis timeout, and than the
// lease. The record must keep its lease until the answer is stored, or the
// node give the answer up and store outcome-unknown in its place, so that a
// retry never runs the request again.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

// slowAnswer is the size of the answers sent over the slow link.
const slowAnswer = 160 << 10

// slowTTL is the lease of the slow-link tests: shorter than the 1.7s that
// slowAnswer takes at 96 KB/s, so that a lease not renewed during the
// transfer runs out before the answer is stored.
const slowTTL = 1500 * time.Millisecond

// A 160 KiB answer over a 96 KB/s link to Redis (about 1.7s to send, with a
// 300ms timeout and a 1.5s lease): the client gets its answer within the
// timeout, its retries get 409 while the answer is on its way, then the
// first answer byte for byte; the backend runs once. Before, the keep-alive
// stopped when the completion began and each try was cut at the timeout:
// the lease ran out with no answer stored, and a retry charged again.
func TestSlowLinkLargeAnswerStoredOnce(t *testing.T) {
	t.Parallel()
	run := slowLink(t, 96_000, 6*time.Second)
	if run.counts["in-progress"] == 0 || run.counts["replayed"] == 0 || run.counts["outcome-unknown"] != 0 {
		t.Fatalf("retries got %v: want 409 while the answer was on its way, then the answer", run.counts)
	}
	// Stored within its bound: the timeout, and the time its size takes
	// at 32 KiB/s (record's bulkRate, the slowest link waited for).
	if bound := redisTimeout + slowAnswer*time.Second/(32<<10) + slack; run.storedAt > bound {
		t.Errorf("the answer was stored %v after the request, over its bound %v", run.storedAt, bound)
	}
}

// A link too slow for the answer's bound (8 KB/s: 20s for 160 KiB, where a
// try waits 5.3s): the node gives the answer up while its lock is still
// held, and stores outcome-unknown in its place, logged and counted. Retries get 409, then 502 outcome-unknown with
// Stripe-Should-Retry: false; the backend runs once.
func TestSlowLinkAnswerGivenUp(t *testing.T) {
	t.Parallel()
	if err := registerMetrics(nil); err != nil { // the collectors made
		t.Fatal(err)
	}
	before := counterValue(t, metrics.givenUp.WithLabelValues(givenUpUnknown))
	run := slowLink(t, 8_000, 8*time.Second)
	if run.counts["in-progress"] == 0 || run.counts["outcome-unknown"] == 0 || run.counts["replayed"] != 0 {
		t.Fatalf("retries got %v: want 409 while the answer was on its way, then 502 outcome-unknown", run.counts)
	}
	// Given up once its one try ran out its bound, then a round trip.
	if bound := 2*redisTimeout + slowAnswer*time.Second/(32<<10) + slack; run.storedAt > bound {
		t.Errorf("outcome-unknown was stored %v after the request, over its bound %v", run.storedAt, bound)
	}
	if got := counterValue(t, metrics.givenUp.WithLabelValues(givenUpUnknown)); got < before+1 {
		t.Errorf("answers_given_up_total{record=%q} %v -> %v, want +1", givenUpUnknown, before, got)
	}
}

// slowLinkRun is what the client saw in a slowLink scenario.
type slowLinkRun struct {
	counts   map[string]int // the retries' answers, by retryKind
	storedAt time.Duration  // since the request, when a record was first seen
}

// slowLink sends a request whose answer is slowAnswer bytes through Caddy,
// with Redis behind a link of rate bytes a second (each way, on each
// connection) after a warm-up, then retries it every 400ms, and once more
// as soon as the lease has run out with no record stored, for until. It
// fails the test on a second run of the backend, or on an answer to a
// retry other than the first answer replayed, 409 in-progress, 502
// outcome-unknown, or a 503 that comes while a stored answer's replay
// cannot get through the slow link.
func slowLink(t *testing.T, rate int, until time.Duration) slowLinkRun {
	t.Helper()
	srv, rdb := newRedis(t)
	proxy := redistest.StartProxy(t, srv.Addr)
	var charges atomic.Int64
	be := newRecorder(t, func(w http.ResponseWriter, r *http.Request, s seen) {
		if s.Path == "/pay/warm" {
			fmt.Fprint(w, "warm")
			return
		}
		n := charges.Add(1)
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("X-Charge", strconv.FormatInt(n, 10))
		w.WriteHeader(http.StatusCreated)
		w.Write(bytes.Repeat([]byte(fmt.Sprintf("charge %d;", n)), slowAnswer/len("charge 1;")+1)[:slowAnswer])
	})
	site := startCaddySite(t, paySite(proxy.Addr, be.hostPort(), lockLines("ttl "+slowTTL.String()),
		faultTimeouts, idempotent("max_response 256KiB")), siteOptions{})

	// Warm-up, unthrottled: scripts loaded, connections open.
	if r := site.do("POST", "/pay/warm", `{}`, "Idempotency-Key", "warm"); r.Status != http.StatusOK {
		t.Fatalf("warm-up: %s", r)
	}
	proxy.Throttle(rate)
	const key = "slow-1"
	start := time.Now()
	first := site.do("POST", "/pay", `{}`, "Idempotency-Key", key)
	answered := time.Since(start)
	if first.Status != http.StatusCreated || len(first.Body) != slowAnswer || first.Header.Get("X-Charge") != "1" {
		t.Fatalf("the first answer: %d, %d bytes, charge %q", first.Status, len(first.Body), first.Header.Get("X-Charge"))
	}
	// The client's answer waits for the completion at most the timeout.
	if answered > redisTimeout+slack {
		t.Errorf("the first answer took %v, over the %v timeout", answered, redisTimeout)
	}
	run := retrySlowly(t, site, rdb, proxy, key, start, first, until)
	t.Logf("first answer in %v; record seen at %v; retries: %v", answered.Round(time.Millisecond), run.storedAt.Round(time.Millisecond), run.counts)
	if n := be.executions(key); n != 1 {
		t.Fatalf("the backend ran %d times for one key: a retry charged again (retries: %v)", n, run.counts)
	}
	if run.storedAt == 0 {
		t.Fatalf("no record stored within %v", until)
	}
	return run
}

// retrySlowly is slowLink's retries of key, after the first answer came;
// rdb reaches Redis past the proxy.
func retrySlowly(t *testing.T, site *caddySite, rdb *redis.Client, proxy *redistest.Proxy, key string, start time.Time, first *response, until time.Duration) slowLinkRun {
	t.Helper()
	const every = 400 * time.Millisecond
	lockKey := defaultKey(key)
	run := slowLinkRun{counts: map[string]int{}}
	throttled, expiryRetried := true, false
	next := every
	for time.Since(start) < until {
		time.Sleep(10 * time.Millisecond)
		// The lock first: complete.lua stores the answer and deletes the
		// lock in one step, so a lock seen gone with no record after it
		// is a lease that ran out first.
		expired := !keyExists(t, rdb, lockKey) && !recordCompleted(t, rdb, lockKey)
		if throttled && recordCompleted(t, rdb, lockKey) {
			// A replay over the slow link is a begin whose reply is the
			// whole record: the begin's own timeout cannot carry it.
			// Not what this test is about: the link is restored.
			run.storedAt = time.Since(start)
			proxy.Throttle(0)
			throttled = false
		}
		// The client's retries, and one as soon as the lease has run out
		// with no record stored: a retry then must not run again.
		at := time.Since(start)
		if at < next && !(expired && !expiryRetried) {
			continue
		}
		if expired {
			expiryRetried = true
			t.Errorf("the lease ran out at %v with no record stored", at)
		} else {
			next += every
		}
		r, err := site.send(context.Background(), "POST", "/pay", `{}`, "Idempotency-Key", key)
		if err != nil {
			t.Fatalf("retry at %v: %v", at, err)
		}
		kind := retryKind(t, r, first, at)
		if kind == "unavailable" && !(throttled && recordCompleted(t, rdb, lockKey)) {
			t.Fatalf("retry at %v: 503 while no record was stored: %s", at, r)
		}
		run.counts[kind]++
	}
	return run
}

// retryKind says what a retry got: the first answer replayed, 409
// in-progress, 502 outcome-unknown (no retry), or 503 unavailable. Anything
// else fails the test.
func retryKind(t *testing.T, r, first *response, at time.Duration) string {
	t.Helper()
	switch r.Status {
	case http.StatusCreated:
		if c := r.Header.Get("X-Charge"); c != "1" {
			t.Fatalf("retry at %v: charge %s: the backend ran again", at, c)
		}
		if r.Body != first.Body || r.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("retry at %v: 201 that is not the first answer replayed (replayed %q, %d bytes)",
				at, r.Header.Get("Idempotent-Replayed"), len(r.Body))
		}
		return "replayed"
	case http.StatusConflict, http.StatusBadGateway:
		var p problemDoc
		if err := json.Unmarshal([]byte(r.Body), &p); err != nil {
			t.Fatalf("retry at %v: %d %q", at, r.Status, r.Body)
		}
		kind := p.Type[strings.LastIndexAny(p.Type, "/#")+1:]
		switch {
		case r.Status == http.StatusConflict && kind == "in-progress":
		case r.Status == http.StatusBadGateway && kind == "outcome-unknown" && r.Header.Get("Stripe-Should-Retry") == "false":
		default:
			t.Fatalf("retry at %v: %s", at, r)
		}
		return kind
	case http.StatusServiceUnavailable:
		return "unavailable"
	}
	t.Fatalf("retry at %v: %d %.200s", at, r.Status, r.Body)
	return ""
}
