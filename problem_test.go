package redislock

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func TestWriteProblemRespond(t *testing.T) {
	h := &Handler{Errors: ErrorsRespond}
	rec := httptest.NewRecorder()
	if err := h.writeProblem(rec, problemConflict.withRetryAfter(3)); err != nil {
		t.Fatal(err)
	}
	res := rec.Result()
	if res.StatusCode != 409 || res.Header.Get("Content-Type") != "application/problem+json" ||
		res.Header.Get("Retry-After") != "3" || res.Header.Get("Cache-Control") != "no-store" {
		t.Fatalf("status %d, headers %v", res.StatusCode, res.Header)
	}
	var body map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatal(err)
	}
	if body["type"] != "https://github.com/reqlock/caddy-redis-lock/blob/main/docs/reference.md#conflict" || body["status"] != 409.0 ||
		body["title"] == "" || body["detail"] == "" || body["error"] == nil || len(body) != 5 {
		t.Errorf("body %v", body)
	}
}

func TestProblemsAreStable(t *testing.T) {
	for _, p := range []struct {
		p      problem
		slug   string
		status int
	}{
		{problemConflict, "conflict", 409},
		{problemMissingKey, "missing-key", 400},
		{problemInvalidJSON, "invalid-json", 400},
		{problemInvalidForm, "invalid-form", 400},
		{problemBodyTooLarge, "body-too-large", 413},
		{problemAmbiguousKey, "ambiguous-key", 400},
		{problemBodyTimeout, "body-timeout", 408},
		{problemBodyUnreadable, "body-unreadable", 400},
		{problemUnavailable, "unavailable", 503},
		{problemLockLost, "lock-lost", 503},
		{problemTooEarly, "too-early", 425},
		{problemInvalidIdempotencyKey, "invalid-idempotency-key", 400},
		{problemInProgress, "in-progress", 409},
		{problemMismatch, "key-reused", 422},
		{problemNotReplayable, "not-replayable", 422},
		{problemOutcomeUnknown, "outcome-unknown", 502},
	} {
		rec := httptest.NewRecorder()
		if err := (&Handler{Errors: ErrorsRespond}).writeProblem(rec, p.p); err != nil {
			t.Fatal(err)
		}
		var body problemJSON
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatal(err)
		}
		if rec.Code != p.status || body.Status != p.status || body.Type != problemTypeBase+p.slug {
			t.Errorf("%s: status %d, body %+v", p.slug, rec.Code, body)
		}
		if strings.Contains(strings.ToLower(body.Detail), "redis") {
			t.Errorf("%s: detail names Redis: %q", p.slug, body.Detail)
		}
		wantRetry := p.status == 503
		if (rec.Header().Get("Retry-After") == "1") != wantRetry {
			t.Errorf("%s: Retry-After %q", p.slug, rec.Header().Get("Retry-After"))
		}
	}
}

func TestWriteProblemHandleErrors(t *testing.T) {
	h := &Handler{Errors: ErrorsHandleErrors}
	rec := httptest.NewRecorder()
	err := h.writeProblem(rec, problemUnavailable)
	var he caddyhttp.HandlerError
	if !errors.As(err, &he) || he.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("err = %#v, want a caddyhttp.HandlerError with 503", err)
	}
	if rec.Header().Get("Retry-After") != "1" {
		t.Errorf("Retry-After = %q, want 1 for handle_errors too", rec.Header().Get("Retry-After"))
	}
	if rec.Body.Len() != 0 || rec.Header().Get("Content-Type") != "" {
		t.Errorf("handle_errors mode wrote a body: %q", rec.Body.String())
	}
}

func TestRetryAfterRounding(t *testing.T) {
	for _, tt := range []struct{ secs, want int }{{0, 1}, {-3, 1}, {1, 1}, {7, 7}} {
		if got := problemConflict.withRetryAfter(tt.secs).retryAfter; got != tt.want {
			t.Errorf("withRetryAfter(%d) = %d, want %d", tt.secs, got, tt.want)
		}
	}
}

// allProblems is every problem the handler writes, with the Stripe error
// type its body carries.
var allProblems = []struct {
	p       problem
	errType string
}{
	{problemConflict, "idempotency_error"},
	{problemMissingKey, "invalid_request_error"},
	{problemInvalidJSON, "invalid_request_error"},
	{problemInvalidForm, "invalid_request_error"},
	{problemAmbiguousKey, "invalid_request_error"},
	{problemBodyTimeout, "invalid_request_error"},
	{problemBodyUnreadable, "invalid_request_error"},
	{problemBodyTooLarge, "invalid_request_error"},
	{problemUnavailable, "api_error"},
	{problemLockLost, "api_error"},
	{problemInvalidIdempotencyKey, "invalid_request_error"},
	{problemInProgress, "idempotency_error"},
	{problemMismatch, "idempotency_error"},
	{problemNotReplayable, "idempotency_error"},
	{problemOutcomeUnknown, "api_error"},
	{problemTooEarly, "invalid_request_error"},
}

// Every problem body carries, beside RFC 9457's members, the error member
// Stripe's SDKs read: its type, the problem's slug as code, its detail as
// message. Only outcome-unknown, which a retry only gets again, tells the
// SDKs not to retry.
func TestProblemStripeError(t *testing.T) {
	seen := map[string]bool{}
	for _, tt := range allProblems {
		p := tt.p
		if seen[p.slug] {
			t.Errorf("%s listed twice", p.slug)
		}
		seen[p.slug] = true
		var body struct {
			problemJSON
			Error map[string]string `json:"error"`
		}
		if err := json.Unmarshal(p.json, &body); err != nil {
			t.Fatalf("%s: %v", p.slug, err)
		}
		want := map[string]string{"type": tt.errType, "code": p.slug, "message": body.Detail}
		if !maps.Equal(body.Error, want) || body.Detail == "" || body.Type != problemTypeBase+p.slug {
			t.Errorf("%s: error member %v, want %v (body %s)", p.slug, body.Error, want, p.json)
		}
		rec := httptest.NewRecorder()
		if err := writeProblemBody(rec, p); err != nil {
			t.Fatal(err)
		}
		wantRetry := ""
		if p.slug == "outcome-unknown" {
			wantRetry = "false"
		}
		if got := rec.Header().Get("Stripe-Should-Retry"); got != wantRetry || p.headers().Get("Stripe-Should-Retry") != wantRetry {
			t.Errorf("%s: Stripe-Should-Retry %q, want %q", p.slug, got, wantRetry)
		}
		if rec.Body.String() != string(p.json) {
			t.Errorf("%s: wrote %q, want the body marshalled at init", p.slug, rec.Body.String())
		}
	}
	// The stored outcome-unknown record is the problem's body and headers.
	resp := (&Handler{}).unknownOutcome()
	if string(resp.Body) != string(problemOutcomeUnknown.json) || resp.Header.Get("Stripe-Should-Retry") != "false" ||
		!strings.Contains(string(resp.Body), `"error":{"type":"api_error","code":"outcome-unknown"`) {
		t.Errorf("stored outcome-unknown: headers %v, body %s", resp.Header, resp.Body)
	}
	// handle_errors mode sends the retry headers too.
	rec := httptest.NewRecorder()
	if err := (&Handler{Errors: ErrorsHandleErrors}).writeProblem(rec, problemOutcomeUnknown); err == nil ||
		rec.Header().Get("Stripe-Should-Retry") != "false" {
		t.Errorf("handle_errors: err %v, Stripe-Should-Retry %q", err, rec.Header().Get("Stripe-Should-Retry"))
	}
}

func TestHandleErrorsMode(t *testing.T) {
	t.Parallel()
	srv, rdb := newRedis(t)
	be := newRecorder(t, nil)
	s := startCaddySite(t, fmt.Sprintf(`	redis_lock /pay* {http.request.header.Idempotency-Key} {
		redis %s
		errors handle_errors
	}
	reverse_proxy %s
	handle_errors {
		header X-Site-Error yes
		respond "site error page {err.status_code}"
	}`, srv.Addr, be.hostPort()), siteOptions{})

	holdLock(t, rdb, defaultKey("he"), 5*time.Second)
	r := s.do("POST", "/pay", `{}`, "Idempotency-Key", "he")
	if r.Status != http.StatusConflict || r.Body != "site error page 409" || r.Header.Get("X-Site-Error") != "yes" {
		t.Fatalf("409 through handle_errors: %s", r)
	}
	retryAfter(t, r)

	r = s.do("POST", "/pay", `{}`)
	if r.Status != http.StatusBadRequest || r.Body != "site error page 400" {
		t.Fatalf("400 through handle_errors: %s", r)
	}
	if be.executions() != 0 {
		t.Fatalf("backend called %d times", be.executions())
	}
}
