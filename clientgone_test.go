package redislock

// A client that goes away (a browser cancelling the first POST of a double
// click, a mobile client timing out) neither cancels the upstream request
// nor frees the lock, in every mode: the request runs on under its lock,
// which is given back when the backend answers, or a lease after the client
// left when the backend never does.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

// legacyCharge is a backend that charges whatever happens to its caller, as
// legacy backends do: a closed connection does not stop a charge under way.
func legacyCharge(t *testing.T, d time.Duration) *recorder {
	t.Helper()
	var charges atomic.Int64
	return newRecorder(t, func(w http.ResponseWriter, r *http.Request, s seen) {
		n := charges.Add(1)
		time.Sleep(d)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Charge", strconv.FormatInt(n, 10))
		fmt.Fprintf(w, `{"charge":%d}`, n)
	})
}

// checkoutSite is a site whose /checkout is locked by the form's
// checkout_token, as a browser checkout is, with more redis_lock lines.
func checkoutSite(redisAddr, backend string, lines ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\tredis_lock /checkout* checkout:{http.redis_lock.form.checkout_token} {\n\t\tredis %s\n", redisAddr)
	for _, l := range lines {
		fmt.Fprintf(&b, "\t\t%s\n", l)
	}
	fmt.Fprintf(&b, "\t}\n\treverse_proxy %s", backend)
	return b.String()
}

// postForm sends the checkout form with token, the key's form field, and
// X-Test-Key, which the recorder counts by.
func (s *caddySite) postForm(ctx context.Context, token string) (*response, error) {
	form := url.Values{"checkout_token": {token}, "amount": {"19.99"}}.Encode()
	return s.send(ctx, "POST", "/checkout", form,
		"Content-Type", "application/x-www-form-urlencoded", "X-Test-Key", token)
}

// The reproduction: a client that leaves after 0.1s of a 0.8s
// charge, and the same form sent again at once. The backend never runs two
// charges of one key at once; the duplicate gets 409, or waits for the end
// of the first charge (lock mode then runs it again, idempotency mode
// replays the first answer).
func TestClientGoneKeepsLock(t *testing.T) {
	t.Parallel()
	srv, rdb := newRedis(t)
	const charge = 800 * time.Millisecond
	be := legacyCharge(t, charge)
	modes := []struct {
		name     string
		lines    []string
		status   int  // the duplicate's
		replayed bool // the duplicate's answer is the first's
		runs     int
	}{
		{"lock", nil, http.StatusConflict, false, 1},
		{"lock-wait", []string{"wait 3s"}, http.StatusOK, false, 2},
		{"idempotency", []string{"idempotency"}, http.StatusConflict, false, 1},
		{"idempotency-wait", []string{"wait 3s", "idempotency"}, http.StatusOK, true, 1},
	}
	bodies := make([]string, len(modes))
	for i, m := range modes {
		bodies[i] = checkoutSite(srv.Addr, be.hostPort(), append([]string{"ttl 2s"}, m.lines...)...)
	}
	sites := startCaddySites(t, siteOptions{}, bodies...)
	for i, m := range modes {
		s, token := sites[i], "T-"+m.name
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		sent := time.Now()
		_, err := s.postForm(ctx, token)
		cancel()
		if err == nil {
			t.Fatalf("%s: the first client got an answer within 0.1s of a 0.8s charge", m.name)
		}
		dup, err := s.postForm(context.Background(), token)
		answered := time.Since(sent)
		if err != nil {
			t.Fatalf("%s: the duplicate: %v", m.name, err)
		}
		if dup.Status != m.status || (dup.Header.Get(replayedHeader) == "true") != m.replayed {
			t.Errorf("%s: the duplicate got %s, want %d (replayed %v)", m.name, dup, m.status, m.replayed)
		}
		if m.status == http.StatusOK && answered < charge {
			t.Errorf("%s: the duplicate was answered %v after the first was sent, before the first charge could end", m.name, answered)
		}
		if m.replayed && !strings.Contains(dup.Body, `"charge":`) {
			t.Errorf("%s: the replay: %s", m.name, dup)
		}
		key := engine.Key(DefaultPrefix, "", "checkout:"+token)
		redistest.Eventually(t, 5*time.Second, m.name+": the lock given back", func() bool { return !keyExists(t, rdb, key) })
		if n := be.executions(token); n != m.runs {
			t.Errorf("%s: the backend charged %d times, want %d", m.name, n, m.runs)
		}
	}
	be.mu.Lock()
	overlaps := be.overlaps
	be.mu.Unlock()
	if overlaps != 0 {
		t.Fatalf("two charges of one key ran at once %d times", overlaps)
	}
}

// A backend that never answers a client that left holds the key for a lease
// after the client left, no longer: then the upstream request is cancelled,
// the lock given back, and the request counted as gave_up. Lock mode; the
// idempotency mode's case is TestIdempotencyClientGoneBackendHangs.
func TestClientGoneBackendHangs(t *testing.T) {
	t.Parallel()
	srv, rdb := newRedis(t)
	be := newRecorder(t, func(w http.ResponseWriter, r *http.Request, s seen) {
		if s.Path == "/pay/hang" {
			<-r.Context().Done()
			return
		}
		io.WriteString(w, "ok")
	})
	s := startCaddySite(t, paySite(srv.Addr, be.hostPort(), lockLines("ttl 1s")), siteOptions{admin: true})
	gaveUp := func() float64 { return requestsCounter(t, s, resultGaveUp) }
	before := gaveUp()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	left := time.Now().Add(200 * time.Millisecond)
	if _, err := s.send(ctx, "POST", "/pay/hang", `{}`, "Idempotency-Key", "hung"); err == nil {
		t.Fatal("an answer from a backend that hangs")
	}
	entered := be.waitEntered(t, 5*time.Second)
	// While the backend runs, past the client's leaving, the key is held.
	time.Sleep(300 * time.Millisecond)
	if r := s.do("POST", "/pay/other", `{}`, "Idempotency-Key", "hung"); r.Status != http.StatusConflict {
		t.Fatalf("a duplicate after the client left, while the backend still runs: %s", r)
	}
	select {
	case <-entered.Ctx.Done():
		if d := time.Since(left); d < 900*time.Millisecond || d > 3*time.Second {
			t.Errorf("backend request ended %v after the client left, want about the 1s lease", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the backend request still runs 5s after its client left")
	}
	redistest.Eventually(t, 5*time.Second, "the lock given back", func() bool { return !keyExists(t, rdb, defaultKey("hung")) })
	if r := s.do("POST", "/pay/other", `{}`, "Idempotency-Key", "hung"); r.Status != http.StatusOK {
		t.Fatalf("a retry once the request was given up: %s", r)
	}
	redistest.Eventually(t, 5*time.Second, "gave_up counted", func() bool { return gaveUp() >= before+1 })
}

// requestsCounter reads caddy_redis_lock_requests_total{result} from the
// site's admin API (siteOptions.admin).
func requestsCounter(t *testing.T, s *caddySite, result string) float64 {
	t.Helper()
	r, err := sendRequest(context.Background(), s.client, "GET", s.AdminURL+"/metrics", "")
	if err != nil || r.Status != 200 {
		t.Fatalf("GET /metrics: %v %v", err, r)
	}
	if strings.Contains(r.Body, "metric-key-") {
		t.Fatal("a request key appears in the metrics")
	}
	prefix := `caddy_redis_lock_requests_total{result="` + result + `"} `
	for line := range strings.Lines(r.Body) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), prefix); ok {
			var f float64
			fmt.Sscan(v, &f)
			return f
		}
	}
	return 0
}
