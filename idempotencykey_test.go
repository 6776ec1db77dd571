package redislock

// The Idempotency-Key value: 1 to 255 printable ASCII characters, bare or as
// an RFC 8941 sf-string, or 400 without reaching anything.

import (
	"net/http"
	"strings"
	"testing"
)

// An Idempotency-Key that is not 1 to 255 printable ASCII characters, bare
// or as an sf-string, is 400 and reaches nothing.
func TestIdempotencyKeyValidation(t *testing.T) {
	t.Parallel()
	srv, _ := newRedis(t)
	be := chargeBackend(t)
	s := startCaddySite(t, paySite(srv.Addr, be.hostPort(), storedAnswers()), siteOptions{})
	for _, key := range []string{strings.Repeat("k", 256), `"unterminated`, `"a"b"`, `""`, "caf\u00e9", `"\x"`} {
		p := expectProblem(t, s.do("POST", "/pay", `{}`, "Idempotency-Key", key), http.StatusBadRequest)
		if !strings.HasSuffix(p.Type, "#invalid-idempotency-key") {
			t.Errorf("%q: problem %q", key, p.Type)
		}
	}
	for _, key := range []string{strings.Repeat("k", 255), `"with \"escapes\" and spaces"`, "9f8b2c1e-uuid-like"} {
		if r := s.do("POST", "/pay", `{}`, "Idempotency-Key", key); r.Status != http.StatusCreated {
			t.Errorf("%q: %s", key, r)
		}
	}
	if be.executions() != 3 {
		t.Fatalf("backend reached %d times, want 3", be.executions())
	}
}
