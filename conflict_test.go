package redislock

// Duplicates while a lock is held, by another node or by a request in
// flight: 409 with a Retry-After and no upstream request, or, with wait,
// their turn after the holder; in idempotency mode, one execution and the
// replay after it.

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
)

func TestConflictWhileHeldByAnotherNode(t *testing.T) {
	t.Parallel()
	_, rdb := newRedis(t)
	be := newRecorder(t, nil)
	s := startCaddySite(t, paySite(rdb.Options().Addr, be.hostPort()), siteOptions{})

	holdLock(t, rdb, defaultKey("held-1"), 4500*time.Millisecond)
	r := s.do("POST", "/pay", `{}`, "Idempotency-Key", "held-1")
	expectProblem(t, r, http.StatusConflict)
	if n := retryAfter(t, r); n > 5 {
		t.Errorf("Retry-After = %d, want the remaining lease (<= 5s)", n)
	}
	if be.executions() != 0 {
		t.Fatalf("backend called %d times while the lock was held", be.executions())
	}

	// A lease with less than a second left still says at least 1.
	var last *response
	for range 5 { // on a very slow machine the short lease may expire first
		holdLock(t, rdb, defaultKey("held-2"), 700*time.Millisecond)
		last = s.do("POST", "/pay", `{}`, "Idempotency-Key", "held-2")
		if last.Status == http.StatusConflict {
			break
		}
	}
	expectProblem(t, last, http.StatusConflict)
	if n := retryAfter(t, last); n != 1 {
		t.Errorf("Retry-After = %d for a lease under 1s, want 1", n)
	}

	// Another key and unmatched paths are not affected.
	if r := s.do("POST", "/pay", `{}`, "Idempotency-Key", "free"); r.Status != 200 {
		t.Fatalf("free key: %s", r)
	}
	if r := s.do("GET", "/other", "", "Idempotency-Key", "held-1"); r.Status != 200 {
		t.Fatalf("unmatched path: %s", r)
	}
}

func TestConflictWhileRequestInFlight(t *testing.T) {
	t.Parallel()
	_, rdb := newRedis(t)
	g := newGate()
	be := newRecorder(t, func(w http.ResponseWriter, r *http.Request, _ seen) {
		select {
		case <-g.ch:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, "charged")
	})
	t.Cleanup(g.open)
	s := startCaddySite(t, paySite(rdb.Options().Addr, be.hostPort()), siteOptions{})

	first := make(chan *response, 1)
	go func() {
		r, err := s.send(context.Background(), "POST", "/pay", `{"amount":1}`, "Idempotency-Key", "k")
		if err != nil {
			t.Error(err)
		}
		first <- r
	}()
	be.waitEntered(t, 10*time.Second)
	for range 3 {
		r := s.do("POST", "/pay", `{"amount":1}`, "Idempotency-Key", "k")
		expectProblem(t, r, http.StatusConflict)
		if n := retryAfter(t, r); n > 10 {
			t.Errorf("Retry-After = %d, want at most the 10s default ttl", n)
		}
	}
	g.open()
	if r := <-first; r == nil || r.Status != 200 || r.Body != "charged" {
		t.Fatalf("first request: %v", r)
	}
	if be.executions() != 1 {
		t.Fatalf("backend executions = %d, want 1", be.executions())
	}
}

func TestWaitForHeldLock(t *testing.T) {
	t.Parallel()
	_, rdb := newRedis(t)
	g := newGate()
	var mu sync.Mutex
	done := map[int64]time.Time{}
	be := newRecorder(t, func(w http.ResponseWriter, r *http.Request, s seen) {
		if s.Path == "/pay/slow" {
			select {
			case <-g.ch:
			case <-r.Context().Done():
				return
			}
		}
		mu.Lock()
		done[parseFence(s.Fencing)] = time.Now()
		mu.Unlock()
		io.WriteString(w, "ok")
	})
	t.Cleanup(g.open)
	s := startCaddySite(t, paySite(rdb.Options().Addr, be.hostPort(), lockLines("wait 20s")), siteOptions{})

	first := make(chan *response, 1)
	go func() {
		r, _ := s.send(context.Background(), "POST", "/pay/slow", `{}`, "Idempotency-Key", "w")
		first <- r
	}()
	be.waitEntered(t, 10*time.Second)
	second := make(chan *response, 1)
	go func() {
		r, _ := s.send(context.Background(), "POST", "/pay/fast", `{}`, "Idempotency-Key", "w")
		second <- r
	}()
	// The duplicate waits: it neither reaches the backend nor gets an answer
	// while the first holds the lock.
	select {
	case r := <-second:
		t.Fatalf("duplicate answered while the lock was held: %v", r)
	case <-time.After(700 * time.Millisecond):
	}
	if be.executions() != 1 {
		t.Fatalf("backend executions while held = %d, want 1", be.executions())
	}
	g.open()
	r1, r2 := <-first, <-second
	if r1 == nil || r1.Status != 200 {
		t.Fatalf("first: %v", r1)
	}
	if r2 == nil || r2.Status != 200 {
		t.Fatalf("waiting duplicate: %v", r2)
	}
	reqs := be.requests()
	if len(reqs) != 2 || be.overlaps != 0 {
		t.Fatalf("backend executions = %d, overlaps = %d; want 2 in turn", len(reqs), be.overlaps)
	}
	f1, f2 := fence(t, reqs[0].Fencing), fence(t, reqs[1].Fencing)
	if f2 <= f1 {
		t.Fatalf("fencing tokens %d then %d: want increasing", f1, f2)
	}
	if !reqs[1].At.After(done[f1]) {
		t.Fatal("the waiting duplicate reached the backend before the first finished")
	}
}

func TestConflictRetryAfterRoundsUp(t *testing.T) {
	srv, rdb := newRedis(t)
	h := unitHandler(t, srv.Addr, nil)
	key := engine.Key(DefaultPrefix, "", "k4")
	holdLock(t, rdb, key, 2300*time.Millisecond)
	h.holds.observe(2100 * time.Millisecond) // this route's locks are held about 2.1s
	rec := httptest.NewRecorder()
	r, repl := unitRequest("POST", "k4", "")
	called := false
	h.ServeHTTP(rec, r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { called = true; return nil }))
	if called || rec.Code != 409 || rec.Header().Get("Retry-After") != "3" {
		t.Fatalf("next called %v, status %d, Retry-After %q: want 409 and 3 (a 2.1s hold rounded up)", called, rec.Code, rec.Header().Get("Retry-After"))
	}
	if res, _ := repl.GetString(phResult); res != resultConflict {
		t.Errorf("result %q", res)
	}
}

// Concurrent duplicates while in progress: one execution, the others 409,
// and every retry after it completes gets the same answer.
func TestIdempotencyConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	srv, _ := newRedis(t)
	be := chargeBackend(t)
	s := startCaddySite(t, paySite(srv.Addr, be.hostPort(), storedAnswers()), siteOptions{})
	const n = 20
	var wg sync.WaitGroup
	statuses := make([]int, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if r, err := s.send(context.Background(), "POST", "/pay/slow", `{}`, "Idempotency-Key", "dup"); err == nil {
				statuses[i] = r.Status
			}
		}()
	}
	wg.Wait()
	ok, conflict := 0, 0
	for _, st := range statuses {
		switch st {
		case 200:
			ok++
		case 409:
			conflict++
		}
	}
	if ok != 1 || conflict != n-1 {
		t.Fatalf("statuses %v: want one 200 and %d 409", statuses, n-1)
	}
	r := s.do("POST", "/pay/slow", `{}`, "Idempotency-Key", "dup")
	if r.Status != 200 || r.Header.Get(replayedHeader) != "true" {
		t.Fatalf("retry after completion: %s", r)
	}
	if e := be.executions("dup"); e != 1 || be.overlaps != 0 {
		t.Fatalf("backend executions %d, overlaps %d", e, be.overlaps)
	}
}
