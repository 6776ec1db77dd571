package redislock

// The request fingerprint in idempotency mode: a key reused for another
// body, path, query or method is 422, while its request runs and after.

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// A fingerprint is stored with every record and compared by the next
// version of the plugin too: its bytes must not change. The value is the
// SHA-256 of the parts as written since the first release (each name and
// value after its length as a uvarint, a header's values joined by NUL).
func TestFingerprintStable(t *testing.T) {
	c := IdempotencyConfig{Fingerprint: []string{partMethod, partPath, partQuery, partBody}, FingerprintHeaders: []string{"content-type", "x-tenant"}}
	r := httptest.NewRequest(http.MethodPost, "/v1/charges?expand=customer", nil)
	r.Header.Set("Content-Type", "application/json")
	r.Header.Add("X-Tenant", "a")
	r.Header.Add("X-Tenant", "b")
	const want = "9a8217da55414cd95deadd10b52731cc976427eda57875a327c9448ba4132842"
	if got := c.fingerprint(r, []byte(`{"amount":1299}`), nil); got != want {
		t.Fatalf("fingerprint %s, want %s: records stored before would no longer match their retries", got, want)
	}
}

// Two different requests whose parts, written one after the other, make
// the same bytes (a path that runs into the query, a query into the body,
// a body into a header, one header into the next) have different
// fingerprints: each part is its name and value after their lengths, so
// that where one part ends is part of the fingerprint.
func TestFingerprintPartsDoNotRunTogether(t *testing.T) {
	type req struct {
		target, body string
		header       [][2]string
	}
	for _, tc := range []struct {
		name    string
		headers []string // FingerprintHeaders
		a, b    req
	}{
		{"path into query", nil, req{target: "/pquery"}, req{target: "/p?query"}},
		{"query into body", nil, req{target: "/p?a", body: "bodyb"}, req{target: "/p?abody", body: "b"}},
		{"body into header", []string{"X-A"}, req{target: "/p", body: "{}header X-A"},
			req{target: "/p", body: "{}", header: [][2]string{{"X-A", "header X-A"}}}},
		{"header into header", []string{"X-A", "X-B"}, req{target: "/p", header: [][2]string{{"X-A", "1"}, {"X-B", "header X-B2"}}},
			req{target: "/p", header: [][2]string{{"X-A", "1header X-B"}, {"X-B", "2"}}}},
		// "header Ab" is 9 bytes long, and 9 is a tab, which a header
		// value may hold: the names' lengths alone do not tell the parts
		// apart, the values' must too.
		{"header into header with its name's length", []string{"Ab", "Cd"},
			req{target: "/p", header: [][2]string{{"Ab", "1"}, {"Cd", "a\theader Cdb"}}},
			req{target: "/p", header: [][2]string{{"Ab", "1\theader Cda"}, {"Cd", "b"}}}},
	} {
		c := IdempotencyConfig{Fingerprint: fingerprintParts, FingerprintHeaders: tc.headers}
		fingerprint := func(q req) string {
			r := httptest.NewRequest(http.MethodPost, q.target, nil)
			for _, h := range q.header {
				r.Header.Add(h[0], h[1])
			}
			return c.fingerprint(r, []byte(q.body), nil)
		}
		if fa, fb := fingerprint(tc.a), fingerprint(tc.b); fa == fb {
			t.Errorf("%s: %+v and %+v share the fingerprint %s", tc.name, tc.a, tc.b, fa)
		}
	}
}

func TestIdempotencyMismatch(t *testing.T) {
	t.Parallel()
	srv, _ := newRedis(t)
	be := chargeBackend(t)
	s := startCaddySite(t, paySite(srv.Addr, be.hostPort(), storedAnswers()), siteOptions{})

	inFlight := make(chan *response, 1)
	go func() {
		r, _ := s.send(context.Background(), "POST", "/pay/slow", `{"amount":1}`, "Idempotency-Key", "k")
		inFlight <- r
	}()
	be.waitEntered(t, 10*time.Second)
	// In progress: another body, path or method with the key is 422.
	for _, req := range [][2]string{{"/pay/slow", `{"amount":2}`}, {"/pay/other", `{"amount":1}`}} {
		expectProblem(t, s.do("POST", req[0], req[1], "Idempotency-Key", "k"), http.StatusUnprocessableEntity)
	}
	// The same request meanwhile is 409 with Retry-After.
	r := s.do("POST", "/pay/slow", `{"amount":1}`, "Idempotency-Key", "k")
	expectProblem(t, r, http.StatusConflict)
	retryAfter(t, r)
	if r := <-inFlight; r == nil || r.Status != 200 {
		t.Fatalf("first request: %v", r)
	}
	// Completed: still 422 for another request with the key.
	expectProblem(t, s.do("PUT", "/pay/slow", `{"amount":1}`, "Idempotency-Key", "k"), http.StatusUnprocessableEntity)
	expectProblem(t, s.do("POST", "/pay/slow?x=1", `{"amount":1}`, "Idempotency-Key", "k"), http.StatusUnprocessableEntity)
	if n := be.executions("k"); n != 1 {
		t.Fatalf("backend ran k %d times, want once", n)
	}
}

// fingerprint json: the body compared by value, in the RFC 8785 canonical
// form. A retry that re-serialises its body (members in another order,
// other whitespace, 1e3 for 1000) is replayed; another value is 422; a body
// that is not JSON, or names a member twice, is 400 invalid-json. The
// default, body, compares bytes.
func TestFingerprintJSON(t *testing.T) {
	t.Parallel()
	srv, _ := newRedis(t)
	be := chargeBackend(t)
	sites := startCaddySites(t, siteOptions{},
		paySite(srv.Addr, be.hostPort(), storedAnswers("fingerprint method path query json")),
		paySite(srv.Addr, be.hostPort(), storedAnswers()))
	byValue, byBytes := sites[0], sites[1]
	const first = `{"amount":1000,"currency":"eur","meta":{"a":1,"b":[1,2]}}`
	r := byValue.do("POST", "/pay", first, "Idempotency-Key", "j1")
	if r.Status != http.StatusCreated {
		t.Fatalf("first: %s", r)
	}
	for _, same := range []string{
		`{"currency":"eur","amount":1000,"meta":{"b":[1,2],"a":1}}`,
		"{ \"amount\": 1e3, \"currency\": \"eur\",\n \"meta\": {\"a\": 1.0, \"b\": [1, 2]} }",
	} {
		again := byValue.do("POST", "/pay", same, "Idempotency-Key", "j1")
		if again.Header.Get(replayedHeader) != "true" || again.Body != r.Body {
			t.Errorf("%s: %s, want the first answer replayed", same, again)
		}
	}
	for _, other := range []string{
		`{"amount":1001,"currency":"eur","meta":{"a":1,"b":[1,2]}}`,
		`{"amount":1000,"currency":"eur","meta":{"a":1,"b":[2,1]}}`,
	} {
		expectProblem(t, byValue.do("POST", "/pay", other, "Idempotency-Key", "j1"), http.StatusUnprocessableEntity)
	}
	for _, bad := range []string{`{"amount":`, `amount=1000`, `{"amount":1,"amount":2}`} {
		p := expectProblem(t, byValue.do("POST", "/pay", bad, "Idempotency-Key", "j2"), http.StatusBadRequest)
		if !strings.HasSuffix(p.Type, "#invalid-json") {
			t.Errorf("%q: %s, want invalid-json", bad, p.Type)
		}
	}
	if n := be.executions("j1", "j2"); n != 1 {
		t.Errorf("backend ran %d times, want once", n)
	}
	// Bytes by default: the reordered body is another request.
	byBytes.do("POST", "/pay", first, "Idempotency-Key", "b1")
	expectProblem(t, byBytes.do("POST", "/pay", `{"currency":"eur","amount":1000,"meta":{"a":1,"b":[1,2]}}`, "Idempotency-Key", "b1"), http.StatusUnprocessableEntity)
}
