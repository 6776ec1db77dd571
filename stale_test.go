package redislock

// A holder whose lease ran out while Redis was down must not store its
// answer over a later run's: two Caddy nodes (two sites of one config, each
// with its own Redis client), one Redis with AOF that is killed and
// restarted from its file after the lease.

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
	"github.com/reqlock/caddy-redis-lock/internal/redistest"
	"github.com/reqlock/caddy-redis-lock/record"
)

// TestStaleHolderNeverStoresOverLaterRun: node A's charge is answered while
// Redis is down, and its completion is retried in the background. Redis
// comes back from its AOF after the lease, with A's record in progress and
// its lock gone: abandoned, so a retry on node B is answered 409 for a lease
// more, then 502 outcome-unknown, and runs nothing. An operator removes the record (having
// checked the backend), a retry on B runs the charge again, and while B
// runs, A's retried completion reaches Redis (A's way there was cut until
// then). A's lease ran out: its completion must be the checked one, refused
// because B holds the key, so that a retry meanwhile gets 409 in-progress
// and every later one B's answer.
func TestStaleHolderNeverStoresOverLaterRun(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, "--appendonly", "yes")
	ctx := context.Background()
	if v, err := redistest.Do(ctx, srv.Addr, nil, "CONFIG", "GET", "appendonly"); err != nil || fmt.Sprint(v) != "[appendonly yes]" {
		t.Fatalf("appendonly: %v %v", v, err)
	}
	gateA := redistest.StartGate(t, srv.Addr) // node A's way to Redis

	var charges atomic.Int64
	release := []chan struct{}{make(chan struct{}), make(chan struct{})}
	be := newRecorder(t, func(w http.ResponseWriter, r *http.Request, s seen) {
		n := charges.Add(1)
		if int(n) <= len(release) {
			select {
			case <-release[n-1]:
			case <-r.Context().Done():
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Charge", strconv.FormatInt(n, 10))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"charge":%d}`, n)
	})
	// Released by the test, or at its end (after a failure) so that the
	// backend, and Caddy, can stop.
	var released [2]atomic.Bool
	free := func(i int) {
		if released[i].CompareAndSwap(false, true) {
			close(release[i])
		}
	}
	t.Cleanup(func() { free(0); free(1) })
	const ttl = 3 * time.Second
	node := func(redisAddr string) string {
		return fmt.Sprintf(`	redis_lock /pay* {http.request.header.Idempotency-Key} {
		redis %s
		ttl 3s
		idempotency
	}
	reverse_proxy %s`, redisAddr, be.hostPort())
	}
	sites := startCaddySites(t, siteOptions{}, node(gateA.Addr), node(srv.Addr))
	a, b := sites[0], sites[1]
	const key, body = "order-stale", `{"amount":1299}`
	lockKey := engine.Key(DefaultPrefix, "", key)
	pay := func(s *caddySite) *response {
		t.Helper()
		return s.do("POST", "/pay", body, "Idempotency-Key", key)
	}
	type result struct {
		r   *response
		err error
	}
	payAsync := func(s *caddySite) chan result {
		out := make(chan result, 1)
		go func() {
			r, err := s.send(ctx, "POST", "/pay", body, "Idempotency-Key", key)
			out <- result{r, err}
		}()
		return out
	}

	// (1) Client 1 on node A, mid-charge, when Redis is SIGKILLed.
	first := payAsync(a)
	be.waitEntered(t, 5*time.Second)
	srv.Stop()
	killed := time.Now()
	gateA.Shut() // A stays cut off from Redis until B runs the charge again
	free(0)
	r1 := <-first
	if r1.err != nil || r1.r.Status != http.StatusCreated || r1.r.Header.Get("X-Charge") != "1" {
		t.Fatalf("client 1: %v %v, want charge 1", r1.r, r1.err)
	}

	// (2) Redis restarts from its AOF once the lease has run out (it was
	// last renewed before the kill): the record is abandoned, and a retry on
	// node B is answered outcome-unknown. Once the record is removed (an
	// operator's DELETE), a retry runs the charge again.
	time.Sleep(time.Until(killed.Add(ttl + 300*time.Millisecond)))
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	if v, err := redistest.Do(ctx, srv.Addr, nil, "EXISTS", engine.CounterKey(lockKey), lockKey, record.Key(lockKey)); err != nil || v != int64(2) {
		t.Fatalf("after the restart: %v %v keys of fencing counter, lock and record; want the counter and the record (data kept, lease over)", v, err)
	}
	untilAbandoned(t, ttl+2*time.Second, func() *response { return pay(b) })
	if n := be.executions(key); n != 1 {
		t.Fatalf("retries on B of the abandoned record ran the charge: %d executions, want 1", n)
	}
	if _, err := redistest.Do(ctx, srv.Addr, nil, "DEL", record.Key(lockKey)); err != nil {
		t.Fatal(err)
	}
	second := payAsync(b)
	// The backend counts a charge after it is entered: count what entered.
	if s := be.waitEntered(t, 5*time.Second); s.Key != key || be.executions(key) != 2 {
		t.Fatalf("the retry on B did not run the charge again: %+v, %d executions", s, be.executions(key))
	}

	// (3) While B runs it, A's background completion reaches Redis.
	completeSrc, err := os.ReadFile("record/complete.lua")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha1.Sum(completeSrc)
	completeSHA := hex.EncodeToString(sum[:])
	if err := gateA.Open(); err != nil {
		t.Fatal(err)
	}
	// Done when A's record was stored or its completion (complete.lua,
	// whose cache the restart emptied) has run.
	redistest.Eventually(t, 5*time.Second, "node A's completion reaches Redis", func() bool {
		head, _ := redistest.Do(ctx, srv.Addr, nil, "GETRANGE", record.Key(lockKey), "0", "0")
		checked, _ := redistest.Do(ctx, srv.Addr, nil, "SCRIPT", "EXISTS", completeSHA)
		return head == "C" || fmt.Sprint(checked) == "[1]"
	})
	for name, s := range map[string]*caddySite{"A": a, "B": b} {
		r := pay(s)
		if p := expectProblem(t, r, http.StatusConflict); !strings.HasSuffix(p.Type, "in-progress") {
			t.Fatalf("client 3 on node %s while B runs the charge: %s, want 409 in-progress", name, r)
		}
	}

	// (4) B's answer is stored; every later retry, on either node, replays
	// it byte for byte.
	free(1)
	r2 := <-second
	if r2.err != nil || r2.r.Status != http.StatusCreated || r2.r.Header.Get("X-Charge") != "2" || r2.r.Header.Get(replayedHeader) != "" {
		t.Fatalf("client 2 on node B: %v %v, want charge 2 executed", r2.r, r2.err)
	}
	for i := range 2 {
		for name, s := range map[string]*caddySite{"A": a, "B": b} {
			r := pay(s)
			if r.Status != r2.r.Status || r.Body != r2.r.Body || r.Header.Get("X-Charge") != "2" || r.Header.Get(replayedHeader) != "true" {
				t.Fatalf("retry %d on node %s: %s, want the replay of charge 2 %s", i, name, r, r2.r)
			}
		}
	}
	if n := be.executions(key); n != 2 {
		t.Fatalf("the backend ran the charge %d times, want 2", n)
	}
}

// A holder that comes back after its lease (ttl 300ms, renew off: as after
// a long pause) finds its record abandoned, not taken: a retry meanwhile is
// answered 409 for a lease more, then 502 outcome-unknown, and runs
// nothing, and the holder's own
// answer, when it lands, replaces the abandoned record, so that every later
// retry gets it. The backend runs once.
func TestLateHolderAnswerReplacesAbandoned(t *testing.T) {
	t.Parallel()
	srv, rdb := newRedis(t)
	be := chargeBackend(t)
	s := startCaddySite(t, paySite(srv.Addr, be.hostPort(),
		lockLines("ttl 300ms", "renew off", "lost_lock continue"), storedAnswers()), siteOptions{})
	key := defaultKey("late-holder")
	done := make(chan *response, 1)
	go func() { done <- s.do("POST", "/pay/slow", `{}`, "Idempotency-Key", "late-holder") }()
	be.waitEntered(t, 5*time.Second)
	redistest.Eventually(t, 5*time.Second, "the lease to run out", func() bool { return !keyExists(t, rdb, key) })
	untilAbandoned(t, time.Second, func() *response { return s.do("POST", "/pay/slow", `{}`, "Idempotency-Key", "late-holder") })
	if keyExists(t, rdb, key) {
		t.Fatal("the retry of an abandoned record took its lock")
	}
	first := <-done
	if first.Status != http.StatusOK {
		t.Fatalf("first: %s", first)
	}
	redistest.Eventually(t, 2*time.Second, "the late answer stored", func() bool { return recordCompleted(t, rdb, key) })
	again := s.do("POST", "/pay/slow", `{}`, "Idempotency-Key", "late-holder")
	if again.Header.Get(replayedHeader) != "true" || again.Body != first.Body || be.executions("late-holder") != 1 {
		t.Fatalf("retry: %s, %d runs; want the first answer replayed", again, be.executions("late-holder"))
	}
}
