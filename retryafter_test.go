package redislock

import (
	"context"
	"net/http"
	"testing"
	"time"
)

func TestHoldTimesRetryAfter(t *testing.T) {
	var h holdTimes
	for _, c := range []struct {
		remaining time.Duration
		want      int
	}{{10 * time.Second, 1}, {300 * time.Millisecond, 1}} {
		if got := h.retryAfter(c.remaining); got != c.want {
			t.Errorf("before any hold, retryAfter(%v) = %d, want %d", c.remaining, got, c.want)
		}
	}
	for range 20 {
		h.observe(400 * time.Millisecond)
	}
	if got := h.retryAfter(10 * time.Second); got != 1 {
		t.Errorf("after 400ms holds, retryAfter(10s) = %d, want 1", got)
	}
	for range 40 {
		h.observe(2500 * time.Millisecond)
	}
	if got := h.retryAfter(10 * time.Second); got != 3 {
		t.Errorf("after 2.5s holds, retryAfter(10s) = %d, want 3", got)
	}
	if got := h.retryAfter(1500 * time.Millisecond); got != 2 {
		t.Errorf("after 2.5s holds, retryAfter(1.5s) = %d, want 2: never past the remaining lease", got)
	}
	for range 60 {
		h.observe(time.Minute)
	}
	if got := h.retryAfter(10 * time.Minute); got != int(maxRetryAfter/time.Second) {
		t.Errorf("after 1m holds, retryAfter(10m) = %d, want the cap %v", got, maxRetryAfter)
	}
}

// A duplicate of a 400ms charge on a route with a 10s lease is told to
// retry in 1s, not in the renewed lease's 10s, and a client that honours
// that gets the stored answer within about a second of the first
// request's end.
func TestRetryAfterHonouredGetsReplaySoon(t *testing.T) {
	t.Parallel()
	_, rdb := newRedis(t)
	be := newRecorder(t, func(w http.ResponseWriter, r *http.Request, s seen) {
		time.Sleep(400 * time.Millisecond)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"ch_` + s.Key + `"}`))
	})
	s := startCaddySite(t, paySite(rdb.Options().Addr, be.hostPort(), lockLines("ttl 10s"), storedAnswers()), siteOptions{})
	// The route's earlier charges are what the estimate learns from.
	for _, k := range []string{"past-1", "past-2"} {
		if r := s.do("POST", "/pay", `{}`, "Idempotency-Key", k); r.Status != http.StatusCreated {
			t.Fatalf("earlier charge: %s", r)
		}
		be.waitEntered(t, time.Second)
	}

	ended := make(chan time.Time, 1)
	go func() {
		r, err := s.send(context.Background(), "POST", "/pay", `{}`, "Idempotency-Key", "now")
		if err != nil || r.Status != http.StatusCreated {
			t.Errorf("first request: %v %v", r, err)
		}
		ended <- time.Now()
	}()
	be.waitEntered(t, 5*time.Second)
	dup := s.do("POST", "/pay", `{}`, "Idempotency-Key", "now")
	expectProblem(t, dup, http.StatusConflict)
	secs := retryAfter(t, dup)
	if secs != 1 {
		t.Fatalf("Retry-After = %d for a 400ms charge under a 10s lease, want 1", secs)
	}
	time.Sleep(time.Duration(secs) * time.Second)
	retry := s.do("POST", "/pay", `{}`, "Idempotency-Key", "now")
	got := time.Now()
	if retry.Status != http.StatusCreated || retry.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry after Retry-After: %s, want the replay", retry)
	}
	firstEnd := <-ended
	if late := got.Sub(firstEnd); late > 1500*time.Millisecond {
		t.Fatalf("the replay came %v after the first request's end, want about a second at most", late)
	}
	if n := be.executions("now"); n != 1 {
		t.Fatalf("executions = %d, want 1", n)
	}
}
