package redislock

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/caddy-redis-lock/internal/redisconn"
	"github.com/reqlock/caddy-redis-lock/internal/redistest"
	"github.com/reqlock/caddy-redis-lock/record"
)

// An answer given while Redis was down is stored as soon as Redis is back,
// with its tries 25ms apart and woken when Redis answers again: before
// that, a retry on another node could run the request again. Redis is
// killed while the backend runs and restarted from its AOF with the lock
// still on its lease; a retry after the store gets the answer. (That the
// probe's connect wakes the tries is TestRedialAfterRestartWithinBound's.)
func TestAnswerStoredAsRedisComesBack(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, "--appendonly", "yes")
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	be := chargeBackend(t)
	s := startCaddySite(t, paySite(srv.Addr, be.hostPort(), faultTimeouts, idempotent()), siteOptions{})
	var took []time.Duration
	for i := range 5 {
		name := "back-" + string(rune('a'+i))
		first := answeredWhileRedisStops(t, s, be, srv, name)
		time.Sleep(700 * time.Millisecond) // the pool gives up dialling: its probe takes over
		if err := srv.Restart(); err != nil {
			t.Fatal(err)
		}
		up := time.Now() // Restart returns once Redis answers a PING
		redistest.Eventually(t, 5*time.Second, name+"'s answer stored", func() bool {
			return recordCompleted(t, rdb, defaultKey(name))
		})
		took = append(took, time.Since(up))
		again := s.do("POST", "/pay/slow", `{}`, "Idempotency-Key", name)
		if again.Header.Get(replayedHeader) != "true" || again.Body != first.Body || be.executions(name) != 1 {
			t.Fatalf("%s, retried: %s, %d runs; want the first answer replayed", name, again, be.executions(name))
		}
	}
	slices.Sort(took)
	t.Logf("answers stored after Redis answered again: %v", took)
	// A redial interval (the probe's), a connect and a round trip; with
	// tries that backed off to 200ms apart and no wake-up, the median was
	// 174ms.
	if median := took[len(took)/2]; median > 75*time.Millisecond {
		t.Fatalf("median %v from Redis's return to the answer stored, want at most 75ms (tries woken when Redis is back)", median)
	}
}

// answeredWhileRedisStops sends name's slow charge to s and stops srv while
// the backend runs it: the answer, which must be 200, is given while Redis
// is down.
func answeredWhileRedisStops(t *testing.T, s *caddySite, be *recorder, srv *redistest.Server, name string) *response {
	t.Helper()
	done := make(chan *response, 1)
	go func() { done <- s.do("POST", "/pay/slow", `{}`, "Idempotency-Key", name) }()
	be.waitEntered(t, 5*time.Second)
	srv.Stop()
	first := <-done
	if first.Status != http.StatusOK {
		t.Fatalf("%s, answered while Redis was down: %s", name, first)
	}
	return first
}

// A retry that reaches Redis first after an outage, on a node that saw the
// outage, does not run the request again: the node lets the answers given
// meanwhile land first (settle). Node A answers while Redis is down, and
// its lease runs out; Redis comes back from its AOF, and A reaches it
// 25ms later (a gate on A's way to Redis, opened then), while the retry
// on node B reaches it at once. Without settling, B's begin found the key
// free and ran the charge a second time.
func TestRetryAfterRedisReturnFindsTheAnswer(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, "--appendonly", "yes")
	gate := redistest.StartGate(t, srv.Addr)
	be := chargeBackend(t)
	opts := []siteOption{faultTimeouts, lockLines("ttl 1s"), idempotent()}
	sites := startCaddySites(t, siteOptions{}, paySite(gate.Addr, be.hostPort(), opts...), paySite(srv.Addr, be.hostPort(), opts...))
	a, b := sites[0], sites[1]
	const name = "settle"

	first := answeredWhileRedisStops(t, a, be, srv, name)
	// B sees the outage: its retry gets 503.
	expectProblem(t, b.do("POST", "/pay/slow", `{}`, "Idempotency-Key", name), http.StatusServiceUnavailable)
	gate.Shut()
	time.Sleep(1200 * time.Millisecond) // past A's lease
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	up := time.Now()
	go func() {
		time.Sleep(25 * time.Millisecond)
		if err := gate.Open(); err != nil {
			t.Error(err)
		}
	}()
	// B settles either way: before its begin when its pool's probe saw
	// Redis back first, or after it when the begin itself did.
	settled := func() float64 {
		return counterValue(t, metrics.settled.by[settleWaited]) + counterValue(t, metrics.settled.by[settleBegunAgain])
	}
	settledBefore := settled()
	var again *response
	var sent time.Time
	for {
		sent = time.Now()
		again = b.do("POST", "/pay/slow", `{}`, "Idempotency-Key", name)
		if again.Status != http.StatusServiceUnavailable || time.Since(up) > 5*time.Second {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	took := time.Since(sent)
	t.Logf("the retry's answer %v after it was sent, %v after Redis's return: %d %s", took, time.Since(up), again.Status, again.Header.Get(replayedHeader))
	if again.Header.Get(replayedHeader) != "true" || again.Body != first.Body || be.executions(name) != 1 {
		t.Fatalf("retried on B as Redis came back: %s, %d runs; want A's answer replayed", again, be.executions(name))
	}
	if n := settled(); n <= settledBefore {
		t.Errorf("settled_total %v -> %v, want counted", settledBefore, n)
	}
	// Settling and the round trips, on a busy machine (B's reconnect,
	// before, is another test's).
	if bound := redisconn.SettleFor + 2*redisTimeout + slack; took > bound {
		t.Errorf("the replay came %v after the retry was sent, want at most %v", took, bound)
	}
}

// Every answer given while Redis was away is stored once it is back, not
// only the first 64 (the lock client's MaxBackground, which bounded the
// completions tried in the background): one dropped was never stored, its
// lease ran out, and its retry ran the payment again. A hundred payments
// run at once; Redis goes away while the backend holds them, and they are
// answered; when Redis is back every answer is stored, and every retry gets
// it.
func TestManyAnswersStoredAfterOutage(t *testing.T) {
	t.Parallel()
	srv, rdb := newRedis(t)
	gate := redistest.StartGate(t, srv.Addr)
	release := make(chan struct{})
	var charges atomic.Int64
	be := newRecorder(t, func(w http.ResponseWriter, r *http.Request, s seen) {
		<-release
		fmt.Fprintf(w, `{"charge":%d}`, charges.Add(1))
	})
	s := startCaddySite(t, paySite(gate.Addr, be.hostPort(), faultTimeouts, lockLines("ttl 3s"), idempotent()), siteOptions{})
	const payments = 100
	name := func(i int) string { return fmt.Sprintf("many-%03d", i) }
	answers := make([]*response, payments)
	var wg sync.WaitGroup
	for i := range payments {
		wg.Go(func() { answers[i] = s.do("POST", "/pay/many", `{}`, "Idempotency-Key", name(i)) })
	}
	redistest.Eventually(t, 10*time.Second, "every payment at the backend", func() bool { return be.executions() == payments })
	gate.Shut()
	close(release)
	wg.Wait()
	for i, a := range answers {
		if a.Status != http.StatusOK {
			t.Fatalf("%s, answered while Redis was away: %s", name(i), a)
		}
	}
	// A second more away, with every answer tried again every 25ms: what
	// that costs (the whole test process, other tests included).
	before := selfCPU()
	time.Sleep(time.Second)
	t.Logf("%d answers tried again for 1s while Redis refused connections: %v of CPU", payments, time.Duration(selfCPU()-before))
	if err := gate.Open(); err != nil {
		t.Fatal(err)
	}
	var unstored []string
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		unstored = unstored[:0]
		for i := range payments {
			if !recordCompleted(t, rdb, defaultKey(name(i))) {
				unstored = append(unstored, name(i))
			}
		}
		if len(unstored) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("5s after Redis came back, %d of %d answers given while it was away are not stored (%v ...): their retries will run again", len(unstored), payments, unstored[0])
		}
	}
	for i := range payments {
		again := s.do("POST", "/pay/many", `{}`, "Idempotency-Key", name(i))
		if again.Header.Get(replayedHeader) != "true" || again.Body != answers[i].Body || be.executions(name(i)) != 1 {
			t.Fatalf("%s, retried: %s, %d runs; want its answer replayed", name(i), again, be.executions(name(i)))
		}
	}
}

// The answers a route holds in the background are bounded in bytes too
// (maxAnswersHeld): one that would go past it is not taken, one that fits
// is, and what it held is given back when it ends.
func TestAnswersHeldBounded(t *testing.T) {
	t.Parallel()
	h := unitHandler(t, redistest.Start(t).Addr, nil)
	big := &record.Response{Body: make([]byte, maxAnswersHeld/2+1)}
	ran := make(chan struct{})
	wait := make(chan struct{})
	if !h.storeInBackground(context.Background(), big, func(context.Context) { close(ran); <-wait }) {
		t.Fatal("the first answer, half the bound, was not taken")
	}
	<-ran
	if h.storeInBackground(context.Background(), big, func(context.Context) { t.Error("ran past the bound") }) {
		t.Fatal("a second answer past the bound was taken")
	}
	close(wait)
	redistest.Eventually(t, 5*time.Second, "the bytes given back", func() bool { return h.answersHeld.Load() == 0 })
	done := make(chan struct{})
	if !h.storeInBackground(context.Background(), big, func(context.Context) { close(done) }) {
		t.Fatal("an answer that fits once the first ended was not taken")
	}
	<-done
}
