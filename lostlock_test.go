package redislock

// Lost locks, and the renewal that keeps a lock: a lock deleted behind its
// holder's back, or a Redis paused under it, cancels the upstream request
// and is answered at the local lease deadline (503, or outcome-unknown in
// idempotency mode), aborts a response already begun, and is counted once;
// lost_lock continue lets the request run. Through Caddy, and through
// ServeHTTP called directly.

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/redis/go-redis/v9"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

func TestRenewalKeepsLongRequestLocked(t *testing.T) {
	t.Parallel()
	srv, _ := newRedis(t)
	be := newRecorder(t, func(w http.ResponseWriter, r *http.Request, s seen) {
		select {
		case <-time.After(3500 * time.Millisecond):
			io.WriteString(w, "slow ok")
		case <-r.Context().Done():
		}
	})
	s := startCaddySite(t, paySite(srv.Addr, be.hostPort(), lockLines("ttl 1s")), siteOptions{})

	first := make(chan *response, 1)
	go func() {
		r, err := s.send(context.Background(), "POST", "/pay", `{}`, "Idempotency-Key", "long")
		if err != nil {
			t.Error(err)
		}
		first <- r
	}()
	start := be.waitEntered(t, 10*time.Second).At
	for _, at := range []time.Duration{600 * time.Millisecond, 1400 * time.Millisecond, 2200 * time.Millisecond, 3000 * time.Millisecond} {
		time.Sleep(time.Until(start.Add(at)))
		r := s.do("POST", "/pay", `{}`, "Idempotency-Key", "long")
		if r.Status != http.StatusConflict {
			t.Errorf("duplicate at %v: %d, want 409 (lock lost before the request ended?)", at, r.Status)
			continue
		}
		retryAfter(t, r)
	}
	r := <-first
	if r == nil || r.Status != 200 || r.Body != "slow ok" {
		t.Fatalf("the long request: %v", r)
	}
	if be.executions() != 1 {
		t.Fatalf("backend executions = %d, want 1", be.executions())
	}
}

func TestLostLockCancelsUpstream(t *testing.T) {
	t.Parallel()
	srv, rdb := newRedis(t)
	type outcome struct {
		fence     int64
		cancelled time.Time
	}
	outcomes := make(chan outcome, 4)
	be := newRecorder(t, func(w http.ResponseWriter, r *http.Request, s seen) {
		f := parseFence(s.Fencing)
		if r.URL.Path == "/pay/slow" {
			select {
			case <-r.Context().Done():
				outcomes <- outcome{f, time.Now()}
				return
			case <-time.After(15 * time.Second):
			}
		}
		w.Header().Set("X-Fence", strconv.FormatInt(f, 10))
		io.WriteString(w, "done")
	})
	s := startCaddySite(t, paySite(srv.Addr, be.hostPort(), lockLines("ttl 1s")), siteOptions{})

	// A first request so that the pool has a connection to pause.
	if r := s.do("POST", "/pay/fast", `{}`, "Idempotency-Key", "warm"); r.Status != 200 {
		t.Fatalf("warm-up: %s", r)
	}
	resp := make(chan *response, 1)
	go func() {
		r, err := s.send(context.Background(), "POST", "/pay/slow", `{}`, "Idempotency-Key", "lost")
		if err != nil {
			t.Error(err)
		}
		resp <- r
	}()
	be.waitEntered(t, 10*time.Second) // the warm-up
	be.waitEntered(t, 10*time.Second) // the slow one
	pausedAt := time.Now()
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	resumed := make(chan struct{})
	t.Cleanup(func() { <-resumed })
	go func() {
		time.Sleep(3 * time.Second)
		_ = srv.Resume()
		close(resumed)
	}()

	var o outcome
	select {
	case o = <-outcomes:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream request was not cancelled after the lock was lost")
	}
	// The lease is 1s from the acquire; pausing came after it. The cut must
	// come from the local lease deadline, not from Redis answering again.
	if d := o.cancelled.Sub(pausedAt); d > 2500*time.Millisecond {
		t.Errorf("upstream cancelled %v after Redis stopped, want about the 1s lease", d)
	} else {
		t.Logf("upstream cancelled %v after Redis stopped", d)
	}
	select {
	case <-resumed:
		t.Error("the upstream request was cancelled only after Redis came back")
	default:
	}
	var r *response
	select {
	case r = <-resp:
	case <-time.After(15 * time.Second):
		t.Fatal("no response to the request that lost its lock")
	}
	if r == nil {
		t.Fatal("the request that lost its lock got no response")
	}
	// The backend had the request: its outcome is unknown, and nothing
	// keeps a retry out any more.
	if p := expectProblem(t, r, http.StatusBadGateway); !strings.HasSuffix(p.Type, "#outcome-unknown") {
		t.Fatalf("lost lock of a request the backend had: %s, want outcome-unknown", p.Type)
	}

	<-resumed
	var next *response
	redistest.Eventually(t, 10*time.Second, "the next holder after Redis came back", func() bool {
		next = s.do("POST", "/pay/fast", `{}`, "Idempotency-Key", "lost")
		return next.Status == 200
	})
	if nf, _ := strconv.ParseInt(next.Header.Get("X-Fence"), 10, 64); nf <= o.fence {
		t.Fatalf("next holder's fencing token %d, want above the lost holder's %d", nf, o.fence)
	}
	if keys := lockKeys(t, rdb, DefaultPrefix); len(keys) != 0 {
		t.Fatalf("lock keys left: %v", keys)
	}
}

// A lock lost while Redis is paused is answered at the local lease
// deadline: 502 outcome-unknown (the backend had the request), within a
// few tens of ms of it, long before Redis resumes.
func TestLostLockAnsweredAtDeadline(t *testing.T) {
	srv, _ := newRedis(t)
	be := newRecorder(t, func(w http.ResponseWriter, r *http.Request, s seen) {
		if s.Key == "lost" {
			<-r.Context().Done() // until the handler cancels it
			return
		}
		io.WriteString(w, "ok")
	})
	const ttl = time.Second
	s := startCaddySite(t, paySite(srv.Addr, be.hostPort(), faultTimeouts, lockLines("ttl 1s")), siteOptions{})
	if r := s.do("POST", "/pay", `{}`, "Idempotency-Key", "warm"); r.Status != 200 {
		t.Fatalf("warm-up: %s", r)
	}
	be.waitEntered(t, 5*time.Second)
	base := goroutineBaseline(s)

	type result struct {
		r   *response
		err error
		at  time.Time
	}
	done := make(chan result, 1)
	sent := time.Now()
	go func() {
		r, err := s.send(context.Background(), "POST", "/pay", `{}`, "Idempotency-Key", "lost")
		done <- result{r, err, time.Now()}
	}()
	be.waitEntered(t, 5*time.Second)
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	defer srv.Resume()
	var res result
	select {
	case res = <-done:
	case <-time.After(4 * time.Second):
		t.Fatal("no answer to the request that lost its lock while Redis was paused")
	}
	if res.err != nil {
		t.Fatal(res.err)
	}
	if p := expectProblem(t, res.r, http.StatusBadGateway); !strings.HasSuffix(p.Type, "#outcome-unknown") || res.r.Header.Get("Stripe-Should-Retry") != "false" {
		t.Errorf("lost lock of a request the backend had: %s, Stripe-Should-Retry %q, want outcome-unknown, false", p.Type, res.r.Header.Get("Stripe-Should-Retry"))
	}
	// The lease was taken after sent; the answer is due at its deadline.
	if d := res.at.Sub(sent); d > ttl+100*time.Millisecond {
		t.Errorf("lost lock answered %v after the request was sent, want at the %v lease deadline", d, ttl)
	} else {
		t.Logf("lost lock answered %v after the request was sent (lease %v)", d, ttl)
	}
	_ = srv.Resume()
	checkBaseline(t, s, base)
}

// A lock lost while Redis is paused: the client gets the outcome-unknown
// problem at the lease deadline, and once Redis is back the same problem is
// what a retry gets, never a second run.
func TestIdempotencyLostLock(t *testing.T) {
	t.Parallel()
	srv, _ := newRedis(t)
	be := chargeBackend(t)
	s := startCaddySite(t, paySite(srv.Addr, be.hostPort(), lockLines("ttl 1s"), redisLines("timeout 300ms"), idempotent()), siteOptions{})
	if r := s.do("POST", "/pay", `{}`, "Idempotency-Key", "warm"); r.Status != http.StatusCreated {
		t.Fatalf("warm-up: %s", r)
	}
	be.waitEntered(t, 5*time.Second)
	done := make(chan *response, 1)
	sent := time.Now()
	go func() {
		r, err := s.send(context.Background(), "POST", "/pay/hang", `{}`, "Idempotency-Key", "lost")
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	be.waitEntered(t, 5*time.Second)
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	var first *response
	select {
	case first = <-done:
	case <-time.After(5 * time.Second):
		_ = srv.Resume()
		t.Fatal("no answer at the lease deadline while Redis was paused")
	}
	answered := time.Since(sent)
	time.Sleep(500 * time.Millisecond) // still paused: the outcome waits to be stored
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	// The outcome is tried again in the background at most 200ms apart: a
	// retry that comes later than that after Redis's return finds it.
	time.Sleep(300 * time.Millisecond)
	if first == nil {
		t.Fatal("no response")
	}
	p := expectProblem(t, first, http.StatusBadGateway)
	if !strings.HasSuffix(p.Type, "#outcome-unknown") || answered > 1200*time.Millisecond {
		t.Fatalf("lost lock answered %q after %v, want outcome-unknown at the 1s lease deadline", p.Type, answered)
	}
	var again *response
	redistest.Eventually(t, 5*time.Second, "the stored outcome after Redis came back", func() bool {
		again = s.do("POST", "/pay/hang", `{}`, "Idempotency-Key", "lost")
		return again.Status != http.StatusServiceUnavailable
	})
	if again.Status != http.StatusBadGateway || again.Header.Get(replayedHeader) != "true" {
		t.Fatalf("retry after the lost lock: %s, want the stored outcome-unknown problem", again)
	}
	if n := be.executions("lost"); n != 1 {
		t.Fatalf("backend ran %d times, want once", n)
	}
}

// loseLock returns a next handler that deletes the lock in Redis (another
// holder's expiry or takeover), optionally after writing, and then waits for
// its request context to end as reverse_proxy would.
func loseLock(t *testing.T, rdb *redis.Client, key, write string, sawCancel *atomic.Bool) caddyhttp.Handler {
	return caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		if write != "" {
			w.Write([]byte(write))
		}
		if err := rdb.Del(context.Background(), key).Err(); err != nil {
			t.Error(err)
		}
		select {
		case <-r.Context().Done():
			sawCancel.Store(true)
			return caddyhttp.Error(http.StatusBadGateway, r.Context().Err())
		case <-time.After(10 * time.Second):
			return errors.New("request context never cancelled")
		}
	})
}

// fastRenew gives a handler a 3s lease renewed every 100ms, so a lock
// deleted behind its back is noticed within about 100ms.
func fastRenew(h *Handler) {
	h.TTL = caddy.Duration(3 * time.Second)
	h.Renew = caddy.Duration(100 * time.Millisecond)
}

// A lock lost before any answer, under a next handler the client trace
// does not see (not net/http's transport), may have run it: outcome-unknown.
func TestLostLockBeforeResponse(t *testing.T) {
	srv, rdb := newRedis(t)
	h := unitHandler(t, srv.Addr, fastRenew)
	key := engine.Key(DefaultPrefix, "", "k5")
	var sawCancel atomic.Bool
	rec := httptest.NewRecorder()
	r, repl := unitRequest("POST", "k5", "")
	err := h.ServeHTTP(rec, r, loseLock(t, rdb, key, "", &sawCancel))
	if err != nil || rec.Code != http.StatusBadGateway || !sawCancel.Load() {
		t.Fatalf("err %v, status %d, upstream cancelled %v: want the 502 replaced by outcome-unknown", err, rec.Code, sawCancel.Load())
	}
	var body problemJSON
	json.Unmarshal(rec.Body.Bytes(), &body)
	if body.Type != problemTypeBase+"outcome-unknown" || rec.Header().Get("Stripe-Should-Retry") != "false" {
		t.Errorf("body %+v, Stripe-Should-Retry %q", body, rec.Header().Get("Stripe-Should-Retry"))
	}
	if res, _ := repl.GetString(phResult); res != resultLost {
		t.Errorf("result %q", res)
	}
}

func TestLostLockAfterBytesAborts(t *testing.T) {
	srv, rdb := newRedis(t)
	h := unitHandler(t, srv.Addr, fastRenew)
	key := engine.Key(DefaultPrefix, "", "k6")
	var sawCancel atomic.Bool
	partial := strings.Repeat("p", holdSize+10) // more than is held: bytes reach the client
	pw := newProbeWriter()
	r, _ := unitRequest("POST", "k6", "")
	var recovered any
	func() {
		defer func() { recovered = recover() }()
		h.ServeHTTP(pw, r, loseLock(t, rdb, key, partial, &sawCancel))
	}()
	if recovered != http.ErrAbortHandler || !sawCancel.Load() {
		t.Fatalf("recovered %v, upstream cancelled %v: want http.ErrAbortHandler", recovered, sawCancel.Load())
	}
	if pw.body.String() != partial[:len(partial)-1] {
		t.Errorf("client side got %d bytes: want all but the held last byte (%d)", pw.body.Len(), len(partial)-1)
	}
}

func TestLostLockContinue(t *testing.T) {
	srv, rdb := newRedis(t)
	h := unitHandler(t, srv.Addr, func(h *Handler) {
		h.TTL = caddy.Duration(3 * time.Second)
		h.Renew = caddy.Duration(50 * time.Millisecond)
		h.LostLock = LostLockContinue
	})
	key := engine.Key(DefaultPrefix, "", "k7")
	rec := httptest.NewRecorder()
	r, repl := unitRequest("POST", "k7", "")
	err := h.ServeHTTP(rec, r, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		rdb.Del(context.Background(), key)
		time.Sleep(300 * time.Millisecond) // several renewals: one finds the lock gone
		if r.Context().Err() != nil {
			t.Error("lost_lock continue must not cancel the request")
		}
		_, err := w.Write([]byte("done"))
		return err
	}))
	if err != nil || rec.Code != 200 || rec.Body.String() != "done" {
		t.Fatalf("err %v, status %d, body %q", err, rec.Code, rec.Body.String())
	}
	if res, _ := repl.GetString(phResult); res != resultLost {
		t.Errorf("result %q, want lost (counted and logged)", res)
	}
}

// TestAbortReachesClientAsBrokenResponse checks what net/http (under Caddy's
// server, which does not recover panics) makes of the abort: the connection
// is closed, the client sees a truncated body and no 500.
func TestAbortReachesClientAsBrokenResponse(t *testing.T) {
	srv, rdb := newRedis(t)
	h := unitHandler(t, srv.Addr, fastRenew)
	key := engine.Key(DefaultPrefix, "", "k8")
	var sawCancel atomic.Bool
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		caddyhttp.NewTestReplacer(r)
		w.Header().Set("Content-Length", "12")
		h.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			w.WriteHeader(200)
			http.NewResponseController(w).Flush()
			return loseLock(t, rdb, key, "partial", &sawCancel).ServeHTTP(w, r)
		}))
	}))
	ts.Config.ErrorLog = nil
	defer ts.Close()
	req, _ := http.NewRequest("POST", ts.URL, nil)
	req.Header.Set("Idempotency-Key", "k8")
	res, err := ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if res.StatusCode != 200 || err == nil || len(b) >= 12 {
		t.Fatalf("status %d, body %q, read error %v: want a truncated 200", res.StatusCode, b, err)
	}
}

// TestLostLockWhenNextAborts is reverse_proxy's way: its upstream request is
// cancelled mid-body, so it panics with http.ErrAbortHandler itself.
func TestLostLockWhenNextAborts(t *testing.T) {
	srv, rdb := newRedis(t)
	h := unitHandler(t, srv.Addr, fastRenew)
	key := engine.Key(DefaultPrefix, "", "k11")
	var sawCancel atomic.Bool
	r, repl := unitRequest("POST", "k11", "")
	lostBefore := counterValue(t, metrics.lost)
	var recovered any
	func() {
		defer func() { recovered = recover() }()
		h.ServeHTTP(newProbeWriter(), r, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			loseLock(t, rdb, key, "partial", &sawCancel).ServeHTTP(w, r)
			panic(http.ErrAbortHandler)
		}))
	}()
	if recovered != http.ErrAbortHandler || keyExists(t, rdb, key) {
		t.Fatalf("recovered %v, lock left %v", recovered, keyExists(t, rdb, key))
	}
	if res, _ := repl.GetString(phResult); res != resultLost || counterValue(t, metrics.lost) != lostBefore+1 {
		t.Errorf("result %q, lost_total %v -> %v: want lost, counted once", res, lostBefore, counterValue(t, metrics.lost))
	}
}

// In idempotency mode too, a lock lost after the response began is counted
// once: the abort's panic passes through the handler's own recover.
func TestIdempotentLostLockAfterResponseStartedCountedOnce(t *testing.T) {
	srv, rdb := newRedis(t)
	h := unitHandler(t, srv.Addr, func(h *Handler) {
		fastRenew(h)
		h.Idempotency = &IdempotencyConfig{}
	})
	key := engine.Key(DefaultPrefix, "", "k13")
	var sawCancel atomic.Bool
	r, repl := unitRequest("POST", "k13", "")
	lostBefore := counterValue(t, metrics.lost)
	var recovered any
	func() {
		defer func() { recovered = recover() }()
		h.ServeHTTP(newProbeWriter(), r, loseLock(t, rdb, key, "partial", &sawCancel))
	}()
	if recovered != http.ErrAbortHandler || !sawCancel.Load() {
		t.Fatalf("recovered %v, upstream cancelled %v; want an abort after the cancellation", recovered, sawCancel.Load())
	}
	if res, _ := repl.GetString(phResult); res != resultLost || counterValue(t, metrics.lost) != lostBefore+1 {
		t.Errorf("result %q, lost_total %v -> %v: want lost, counted once", res, lostBefore, counterValue(t, metrics.lost))
	}
}

// A lock lost before its request reached a backend is lock-lost, which a
// client may retry: reverse_proxy's transport was still in its TLS
// handshake with a backend that never answers it, and wrote nothing. The
// same lock lost once the backend had the request is outcome-unknown
// (TestLostLockAnsweredAtDeadline).
func TestLostLockBeforeSent(t *testing.T) {
	t.Parallel()
	srv, rdb := newRedis(t)
	s := startCaddySite(t, paySite(srv.Addr, redistest.BlackHole(t), lockLines("ttl 1s"),
		proxyTransport("tls", "tls_insecure_skip_verify", "tls_timeout 10s")), siteOptions{})
	done := make(chan *response, 1)
	go func() { done <- s.do("POST", "/pay", `{}`, "Idempotency-Key", "unsent") }()
	redistest.Eventually(t, 5*time.Second, "the lock taken", func() bool { return keyExists(t, rdb, defaultKey("unsent")) })
	lostAt := time.Now()
	if err := rdb.Del(context.Background(), defaultKey("unsent")).Err(); err != nil {
		t.Fatal(err)
	}
	var r *response
	select {
	case r = <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("no answer after the lock was lost during the TLS handshake")
	}
	t.Logf("answered %v after the lock was deleted", time.Since(lostAt))
	if p := expectProblem(t, r, http.StatusServiceUnavailable); !strings.HasSuffix(p.Type, "#lock-lost") || r.Header.Get("Retry-After") != "1" {
		t.Fatalf("lost lock of a request that never left: %s, Retry-After %q, want lock-lost, 1", p.Type, r.Header.Get("Retry-After"))
	}
}
