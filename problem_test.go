package redislock

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

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
	if body["type"] != "https://github.com/reqlock/caddy-redis-lock#conflict" || body["status"] != 409.0 ||
		body["title"] == "" || body["detail"] == "" || len(body) != 4 {
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
		{problemBodyTooLarge, "body-too-large", 413},
		{problemAmbiguousKey, "ambiguous-key", 400},
		{problemBodyTimeout, "body-timeout", 408},
		{problemBodyUnreadable, "body-unreadable", 400},
		{problemUnavailable, "unavailable", 503},
		{problemLockLost, "lock-lost", 503},
		{problemTooEarly, "too-early", 425},
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
