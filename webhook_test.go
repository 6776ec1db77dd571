package redislock

// The README's webhook recipe, as written there, through Caddy: an event
// processed once, its redeliveries (other bytes, another signature) given
// the stored 2xx without reaching the backend, a redelivery during the
// first delivery refused with 409, and an event the backend failed
// processed again when it is redelivered.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// webhookRecipe is the site block of the README's webhook recipe, its
// inside only, with the backend and Redis addresses of the test.
func webhookRecipe(t *testing.T, redisAddr, backend string) string {
	return readmeRecipe(t, "### A webhook receiver", redisAddr, backend,
		"{http.redis_lock.json.id}", "store 2xx", "fingerprint method path")
}

// readmeRecipe is the site block of the README's recipe under heading, its
// inside only, with the backend and Redis addresses of the test; it must
// hold each of must.
func readmeRecipe(t *testing.T, heading, redisAddr, backend string, must ...string) string {
	t.Helper()
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(b), heading)
	if !ok {
		t.Fatalf("README.md has no %q recipe", heading)
	}
	m := regexp.MustCompile("(?s)```caddyfile\n:8080 \\{\n(.*?)\n\\}\n```").FindStringSubmatch(after)
	if m == nil {
		t.Fatalf("the README's %q recipe has no `:8080 { ... }` Caddyfile", heading)
	}
	body := m[1]
	for _, s := range append(must, "127.0.0.1:9000") {
		if !strings.Contains(body, s) {
			t.Fatalf("the README's %q recipe has no %q:\n%s", heading, s, body)
		}
	}
	body = strings.ReplaceAll(body, "127.0.0.1:9000", backend)
	// The recipe uses the default Redis address; the test has its own.
	lockLine := regexp.MustCompile(`(?m)^(\s*)redis_lock .*\{$`)
	loc := lockLine.FindStringSubmatchIndex(body)
	if loc == nil {
		t.Fatalf("the README's %q recipe has no redis_lock block:\n%s", heading, body)
	}
	indent := body[loc[2]:loc[3]]
	return body[:loc[1]] + "\n" + indent + "\tredis " + redisAddr + body[loc[1]:]
}

func TestWebhookRecipe(t *testing.T) {
	t.Parallel()
	srv, _ := newRedis(t)
	var mu sync.Mutex
	runs := map[string]int{}
	failNext := map[string]bool{"evt_fails_once": true}
	slow := newGate()
	be := newRecorder(t, func(w http.ResponseWriter, r *http.Request, s seen) {
		var ev struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(s.Body, &ev); err != nil {
			http.Error(w, "not an event", http.StatusBadRequest)
			return
		}
		mu.Lock()
		runs[ev.ID]++
		n := runs[ev.ID]
		fail := failNext[ev.ID]
		failNext[ev.ID] = false
		mu.Unlock()
		if ev.ID == "evt_slow" {
			select {
			case <-slow.ch:
			case <-r.Context().Done():
				return
			}
		}
		if fail {
			http.Error(w, "database unavailable", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"received":%q,"run":%d}`, ev.ID, n)
	})
	ran := func(id string) int {
		mu.Lock()
		defer mu.Unlock()
		return runs[id]
	}
	s := startCaddySite(t, webhookRecipe(t, srv.Addr, be.hostPort()), siteOptions{})

	// A Stripe-style event; a redelivery is signed again, and its body
	// may differ (pending_webhooks here).
	deliver := func(id string, attempt int) *response {
		t.Helper()
		body := fmt.Sprintf(`{"id":%q,"object":"event","type":"charge.succeeded","pending_webhooks":%d}`, id, 3-attempt)
		return s.do("POST", "/webhooks/stripe", body,
			"Stripe-Signature", fmt.Sprintf("t=%d,v1=signature-%d", 1700000000+attempt, attempt))
	}

	first := deliver("evt_1", 0)
	if first.Status != http.StatusOK || first.Header.Get(replayedHeader) != "" {
		t.Fatalf("the first delivery: %s, want 200 from the backend", first)
	}
	for attempt := 1; attempt <= 2; attempt++ {
		r := deliver("evt_1", attempt)
		if r.Status != http.StatusOK || r.Header.Get(replayedHeader) != "true" || r.Body != first.Body {
			t.Fatalf("redelivery %d: %s, want the stored 200 %q replayed", attempt, r, first.Body)
		}
	}
	if n := ran("evt_1"); n != 1 {
		t.Fatalf("the backend processed evt_1 %d times, want once", n)
	}

	// Another event is processed.
	if r := deliver("evt_2", 0); r.Status != http.StatusOK || r.Header.Get(replayedHeader) != "" || ran("evt_2") != 1 {
		t.Fatalf("another event: %s (processed %d times), want it processed", r, ran("evt_2"))
	}

	// A failure is not stored: the redelivery is processed again, and its
	// 2xx is what later redeliveries get.
	if r := deliver("evt_fails_once", 0); r.Status != http.StatusInternalServerError {
		t.Fatalf("a delivery the backend fails: %s, want its 500", r)
	}
	second := deliver("evt_fails_once", 1)
	if second.Status != http.StatusOK || second.Header.Get(replayedHeader) != "" {
		t.Fatalf("the redelivery of a failed event: %s, want it processed again", second)
	}
	if r := deliver("evt_fails_once", 2); r.Header.Get(replayedHeader) != "true" || r.Body != second.Body {
		t.Fatalf("the next redelivery: %s, want the stored 200 replayed", r)
	}
	if n := ran("evt_fails_once"); n != 2 {
		t.Fatalf("the backend processed evt_fails_once %d times, want twice", n)
	}

	// A redelivery while the event is being processed gets 409; once the
	// first delivery is answered, the next gets its 2xx.
	done := make(chan *response, 1)
	go func() {
		r, err := sendRequest(context.Background(), s.client, "POST", s.URL+"/webhooks/stripe",
			`{"id":"evt_slow","object":"event","pending_webhooks":1}`)
		if err != nil {
			t.Errorf("the slow delivery: %v", err)
		}
		done <- r
	}()
	for deadline := time.Now().Add(10 * time.Second); ran("evt_slow") == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the slow delivery never reached the backend")
		}
	}
	if r := deliver("evt_slow", 1); r.Status != http.StatusConflict {
		t.Errorf("a redelivery during the first: %s, want 409", r)
	}
	slow.open()
	if r := <-done; r == nil || r.Status != http.StatusOK {
		t.Fatalf("the slow delivery: %v, want 200", r)
	}
	if r := deliver("evt_slow", 2); r.Header.Get(replayedHeader) != "true" {
		t.Errorf("a redelivery after the first: %s, want the stored 200 replayed", r)
	}
	if n := ran("evt_slow"); n != 1 {
		t.Errorf("the backend processed evt_slow %d times, want once", n)
	}
}
