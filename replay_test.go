package redislock

// Replays in idempotency mode: a retry gets the stored response (status,
// body, headers but the first client's cookies and hop-by-hop headers),
// encoded for its own Accept-Encoding, within its tenant's scope, and until
// the retention expires.

import (
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/reqlock/caddy-redis-lock/record"
)

func TestIdempotencyReplay(t *testing.T) {
	t.Parallel()
	srv, rdb := newRedis(t)
	be := chargeBackend(t)
	s := startCaddySite(t, paySite(srv.Addr, be.hostPort(), storedAnswers()), siteOptions{})

	first := s.do("POST", "/pay", `{"amount":1299}`, "Idempotency-Key", "order-1")
	if first.Status != http.StatusCreated || first.Header.Get(replayedHeader) != "" {
		t.Fatalf("first request: %s", first)
	}
	if first.Header.Get("Set-Cookie") == "" {
		t.Fatal("the first client did not get its cookie")
	}
	for i := range 3 {
		r := s.do("POST", "/pay", `{"amount":1299}`, "Idempotency-Key", "order-1")
		if r.Status != first.Status || r.Body != first.Body || r.Header.Get("X-Charge") != first.Header.Get("X-Charge") {
			t.Fatalf("retry %d: %s, want the first response %s", i, r, first)
		}
		if r.Header.Get(replayedHeader) != "true" {
			t.Errorf("retry %d without %s: true", i, replayedHeader)
		}
		if got := r.Header.Get("Content-Length"); got != strconv.Itoa(len(first.Body)) {
			t.Errorf("retry %d Content-Length %q, body of %d bytes", i, got, len(first.Body))
		}
		for _, h := range []string{"Set-Cookie", "Keep-Alive"} {
			if v := r.Header.Get(h); v != "" {
				t.Errorf("retry %d replays %s: %q", i, h, v)
			}
		}
	}
	if n := be.executions("order-1"); n != 1 {
		t.Fatalf("backend ran order-1 %d times, want once", n)
	}
	// The bare key and its RFC 8941 sf-string are one key.
	if r := s.do("POST", "/pay", `{"amount":1299}`, "Idempotency-Key", `"order-1"`); r.Header.Get(replayedHeader) != "true" || r.Body != first.Body {
		t.Fatalf("sf-string of the same key: %s", r)
	}
	// Retention: the record expires with it.
	if p := rdb.PTTL(context.Background(), record.Key(defaultKey("order-1"))).Val(); p < 23*time.Hour {
		t.Errorf("record PTTL %v, want the 24h default retention", p)
	}
}

// A replay is right for its client's Accept-Encoding, with encode before or
// after redis_lock in the site.
func TestIdempotencyReplayEncoding(t *testing.T) {
	t.Parallel()
	srv, _ := newRedis(t)
	be := chargeBackend(t)
	lockBlock := fmt.Sprintf(`redis_lock /pay* {http.request.header.Idempotency-Key} {
			redis %s
			idempotency
		}`, srv.Addr)
	s := startCaddySite(t, fmt.Sprintf(`	# redis_lock orders itself before encode: it stores what encode wrote.
	handle /a/* {
		uri strip_prefix /a
		encode gzip
		%[1]s
		reverse_proxy %[2]s
	}
	# encode first, redis_lock inside it: it stores the plain answer.
	handle /b/* {
		uri strip_prefix /b
		route {
			encode gzip
			%[1]s
			reverse_proxy %[2]s
		}
	}`, lockBlock, be.hostPort()), siteOptions{})
	// The harness's client would decompress by itself: ask for gzip by
	// hand, which turns that off.
	plain := func(r *response) string {
		if r.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(strings.NewReader(r.Body))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(zr)
			return string(b)
		}
		return r.Body
	}
	for _, site := range []string{"/a", "/b"} {
		for _, firstGzip := range []bool{true, false} {
			key := fmt.Sprintf("enc%s-%v", site, firstGzip)
			enc := map[bool]string{true: "gzip", false: "identity"}
			first := s.do("POST", site+"/pay/text", `{}`, "Idempotency-Key", key, "Accept-Encoding", enc[firstGzip])
			want := plain(first)
			if !strings.HasPrefix(want, "charge ") {
				t.Fatalf("%s first: %q", key, want[:min(len(want), 40)])
			}
			for _, gz := range []bool{true, false} {
				r := s.do("POST", site+"/pay/text", `{}`, "Idempotency-Key", key, "Accept-Encoding", enc[gz])
				if r.Header.Get(replayedHeader) != "true" {
					t.Fatalf("%s: not replayed: %s", key, r.Header)
				}
				if !gz && r.Header.Get("Content-Encoding") != "" {
					t.Errorf("%s: replay to a client without gzip is %q", key, r.Header.Get("Content-Encoding"))
				}
				if cl := r.Header.Get("Content-Length"); cl != "" && cl != strconv.Itoa(len(r.Body)) {
					t.Errorf("%s: Content-Length %s for %d bytes", key, cl, len(r.Body))
				}
				if got := plain(r); got != want {
					t.Errorf("%s replay (gzip %v): %d bytes differ from the first answer's %d", key, gz, len(got), len(want))
				}
			}
			if n := be.executions(key); n != 1 {
				t.Fatalf("%s: backend ran %d times", key, n)
			}
		}
	}
}

// Tenants under scope never see each other's responses.
func TestIdempotencyScope(t *testing.T) {
	t.Parallel()
	srv, _ := newRedis(t)
	be := chargeBackend(t)
	s := startCaddySite(t, paySite(srv.Addr, be.hostPort(), lockLines("scope {http.request.header.X-Tenant}"), storedAnswers()), siteOptions{})
	a := s.do("POST", "/pay", `{}`, "Idempotency-Key", "same", "X-Tenant", "a")
	b := s.do("POST", "/pay", `{}`, "Idempotency-Key", "same", "X-Tenant", "b")
	if a.Header.Get(replayedHeader) != "" || b.Header.Get(replayedHeader) != "" || a.Body == b.Body {
		t.Fatalf("tenant b got tenant a's answer: a %s, b %s", a, b)
	}
	if r := s.do("POST", "/pay", `{}`, "Idempotency-Key", "same", "X-Tenant", "a"); r.Body != a.Body || r.Header.Get(replayedHeader) != "true" {
		t.Fatalf("tenant a's retry: %s", r)
	}
}

// replay_cookies: the backend's Set-Cookie is stored and replayed within
// the scope (Post/Redirect/Get with a cookie session shows the receipt to a
// double click whose first answer the browser dropped); another scope
// never gets it. Without a scope the config is refused at load
// (testdata/adapt/error_replay_cookies_no_scope).
func TestIdempotencyReplayCookies(t *testing.T) {
	t.Parallel()
	srv, _ := newRedis(t)
	be := chargeBackend(t)
	s := startCaddySite(t, paySite(srv.Addr, be.hostPort(), lockLines("scope {http.request.cookie.session}"), storedAnswers("replay_cookies")), siteOptions{})
	first := s.do("POST", "/pay", `{}`, "Idempotency-Key", "pay-1", "Cookie", "session=s1")
	if first.Status != http.StatusCreated || first.Header.Get("Set-Cookie") == "" {
		t.Fatalf("first request: %s", first)
	}
	again := s.do("POST", "/pay", `{}`, "Idempotency-Key", "pay-1", "Cookie", "session=s1")
	if again.Header.Get(replayedHeader) != "true" || again.Header.Get("Set-Cookie") != first.Header.Get("Set-Cookie") || again.Body != first.Body {
		t.Fatalf("the replay: %s, want the first answer with its Set-Cookie %q", again, first.Header.Get("Set-Cookie"))
	}
	other := s.do("POST", "/pay", `{}`, "Idempotency-Key", "pay-1", "Cookie", "session=s2")
	if other.Header.Get(replayedHeader) != "" || other.Body == first.Body {
		t.Fatalf("another session got the first one's answer: %s", other)
	}
	if n := be.executions("pay-1"); n != 2 {
		t.Fatalf("backend ran pay-1 %d times, want once a session", n)
	}
}

// Retention: the record expires, and the key runs again.
func TestIdempotencyRetentionExpiry(t *testing.T) {
	t.Parallel()
	srv, _ := newRedis(t)
	be := chargeBackend(t)
	s := startCaddySite(t, paySite(srv.Addr, be.hostPort(), storedAnswers("retention 1s")), siteOptions{})
	first := s.do("POST", "/pay", `{}`, "Idempotency-Key", "short")
	if r := s.do("POST", "/pay", `{}`, "Idempotency-Key", "short"); r.Header.Get(replayedHeader) != "true" {
		t.Fatalf("retry within retention: %s", r)
	}
	time.Sleep(1200 * time.Millisecond)
	r := s.do("POST", "/pay", `{}`, "Idempotency-Key", "short")
	if r.Header.Get(replayedHeader) != "" || r.Body == first.Body {
		t.Fatalf("after retention: %s, want a new execution", r)
	}
}
