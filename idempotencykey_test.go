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

// The admin API's key, read as the handler reads the header values in it.
func TestNormaliseKey(t *testing.T) {
	for _, c := range []struct {
		tmpl, key, want string
		invalid         bool
	}{
		{"{http.request.header.Idempotency-Key}", `abc`, "abc", false},
		{"{http.request.header.Idempotency-Key}", `"abc"`, "abc", false},
		{"{http.request.header.Idempotency-Key}", `"a\"b"`, `a"b`, false},
		{"{http.request.header.Idempotency-Key}", `"abc`, "", true},
		{"pay:{http.request.header.Idempotency-Key}:v1", `pay:"abc":v1`, "pay:abc:v1", false},
		{"{http.request.header.X-Tenant}/{http.request.header.Idempotency-Key}", `"t"/"k"`, "t/k", false},
		{"{http.request.header.X-Tenant}/{http.request.header.Idempotency-Key}", `t/"k"`, "t/k", false},
		// A JSON value is taken as it is.
		{"order:{http.redis_lock.json.id}", `order:"7"`, `order:"7"`, false},
		// Values side by side: each split is tried.
		{"{http.request.header.A}{http.request.header.B}", `"a""b"`, "ab", false},
		// Two readings (A "x:y" and B "z", or A "x" and B `y:"z"`): unclear.
		{"{http.request.header.A}:{http.request.header.B}", `x:y:"z"`, "", true},
		{"{http.request.header.A}:{http.request.header.B}", `"a:b":c`, "a:b:c", false},
		// Not the template's shape.
		{"pay:{http.request.header.Idempotency-Key}", `other:"abc"`, "", true},
		// A template Caddy cannot read.
		{strings.Repeat("{", 200) + "{http.request.header.A}", `"a"`, `"a"`, false},
	} {
		got, err := normaliseKey(parseTemplate(c.tmpl), c.key)
		if (err != nil) != c.invalid || got != c.want {
			t.Errorf("%s with %s: %q, %v; want %q (invalid %v)", c.tmpl, c.key, got, err, c.want, c.invalid)
		}
	}
}
