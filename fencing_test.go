package redislock

// Fencing tokens: strictly increasing per key, on the configured header
// and in {http.redis_lock.fencing_token} (with the result and key
// placeholders), never a client's own (as a header or a chunked trailer),
// none on a replay, and their counter under the prefix.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
)

func TestFencingTokenAndPlaceholders(t *testing.T) {
	t.Parallel()
	srv, rdb := newRedis(t)
	be := newRecorder(t, nil)
	s := startCaddySite(t, fmt.Sprintf(`	header >X-Lock-Result {http.redis_lock.result}
	header >X-Lock-Fence {http.redis_lock.fencing_token}
	header >X-Lock-Key {http.redis_lock.key}
	redis_lock /pay* {http.request.header.Idempotency-Key} {
		redis %[1]s
	}
	redis_lock /nofence* {http.request.header.Idempotency-Key} {
		redis %[1]s
		fencing_header off
	}
	redis_lock /custom* {http.request.header.Idempotency-Key} {
		redis %[1]s
		fencing_header X-Fence
	}
	reverse_proxy %[2]s`, srv.Addr, be.hostPort()), siteOptions{})

	last := func() seen {
		reqs := be.requests()
		return reqs[len(reqs)-1]
	}
	t.Run("increasing per key", func(t *testing.T) {
		var prev int64
		for i := range 4 {
			r := s.do("POST", "/pay", `{}`, "Idempotency-Key", "fk-1")
			if r.Status != 200 {
				t.Fatalf("request %d: %s", i, r)
			}
			f := fence(t, last().Fencing)
			if f <= prev {
				t.Fatalf("fencing token %d after %d: want strictly increasing", f, prev)
			}
			prev = f
			if got := r.Header.Get("X-Lock-Fence"); got != strconv.FormatInt(f, 10) {
				t.Errorf("{http.redis_lock.fencing_token} = %q, backend got %d", got, f)
			}
			if got := r.Header.Get("X-Lock-Result"); got != "acquired" {
				t.Errorf("{http.redis_lock.result} = %q, want acquired", got)
			}
			if got, want := r.Header.Get("X-Lock-Key"), defaultKey("fk-1"); got != want {
				t.Errorf("{http.redis_lock.key} = %q, want %q", got, want)
			}
		}
	})
	t.Run("client value not passed through", func(t *testing.T) {
		r := s.do("POST", "/pay", `{}`, "Idempotency-Key", "fk-2", "Fencing-Token", "999999999999999999")
		if r.Status != 200 {
			t.Fatalf("%s", r)
		}
		f := fence(t, last().Fencing)
		if f == 999999999999999999 || r.Header.Get("X-Lock-Fence") != strconv.FormatInt(f, 10) {
			t.Fatalf("backend got Fencing-Token %d, handler's token %q", f, r.Header.Get("X-Lock-Fence"))
		}
	})
	t.Run("conflict result", func(t *testing.T) {
		holdLock(t, rdb, defaultKey("fk-3"), 5*time.Second)
		r := s.do("POST", "/pay", `{}`, "Idempotency-Key", "fk-3")
		expectProblem(t, r, http.StatusConflict)
		if got := r.Header.Get("X-Lock-Result"); got != "conflict" {
			t.Errorf("{http.redis_lock.result} = %q on 409, want conflict", got)
		}
	})
	t.Run("fencing_header off", func(t *testing.T) {
		r := s.do("POST", "/nofence", `{}`, "Idempotency-Key", "fk-4")
		if r.Status != 200 {
			t.Fatalf("%s", r)
		}
		if v := last().Fencing; len(v) != 0 {
			t.Fatalf("fencing_header off: backend got Fencing-Token %q", v)
		}
		if r.Header.Get("X-Lock-Fence") == "" {
			t.Error("{http.redis_lock.fencing_token} is empty with fencing_header off")
		}
	})
	t.Run("custom header name", func(t *testing.T) {
		r := s.do("POST", "/custom", `{}`, "Idempotency-Key", "fk-5", "X-Fence", "1")
		if r.Status != 200 {
			t.Fatalf("%s", r)
		}
		got := last().Header.Values("X-Fence")
		if len(got) != 1 || got[0] != r.Header.Get("X-Lock-Fence") {
			t.Fatalf("X-Fence upstream = %q, want the handler's token %q", got, r.Header.Get("X-Lock-Fence"))
		}
		if v := last().Fencing; len(v) != 0 {
			t.Errorf("Fencing-Token sent as well: %q", v)
		}
	})
}

// A client-sent fencing token never reaches the backend, not even as a
// chunked trailer.
func TestFencingTrailerStripped(t *testing.T) {
	srv, _ := newRedis(t)
	be := newRecorder(t, nil)
	s := startCaddySite(t, paySite(srv.Addr, be.hostPort()), siteOptions{})
	for _, declared := range []bool{true, false} {
		conn, err := net.Dial("tcp", strings.TrimPrefix(s.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		trailerHdr := ""
		if declared {
			trailerHdr = "Trailer: Fencing-Token\r\n"
		}
		fmt.Fprintf(conn, "POST /pay HTTP/1.1\r\nHost: 127.0.0.1\r\nIdempotency-Key: trailer-%v\r\nTransfer-Encoding: chunked\r\n%s\r\n"+
			"2\r\n{}\r\n0\r\nFencing-Token: 99999999999999999\r\nX-Other: kept\r\n\r\n", declared, trailerHdr)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		conn.Close()
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("chunked request with trailers: %v %v", resp, err)
		}
		reqs := be.requests()
		got := reqs[len(reqs)-1]
		if v := got.Trailer.Values("Fencing-Token"); len(v) != 0 {
			t.Errorf("declared=%v: the client's Fencing-Token reached the backend as a trailer: %q", declared, v)
		}
		if len(got.Fencing) != 1 || got.Fencing[0] == "99999999999999999" {
			t.Errorf("declared=%v: Fencing-Token header upstream %q, want the handler's own", declared, got.Fencing)
		}
	}
}

func TestFencingHeaderCannotBeForged(t *testing.T) {
	srv, rdb := newRedis(t)
	h := unitHandler(t, srv.Addr, func(h *Handler) { h.MissingKey = MissingKeyPass })
	var got []string
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		got = append(got, r.Header.Get("Fencing-Token"))
		return nil
	})
	for _, key := range []string{"k2", ""} { // locked, then bypassed (no key)
		r, _ := unitRequest("POST", key, "")
		r.Header.Set("Fencing-Token", "999999999999999999")
		if err := h.ServeHTTP(newProbeWriter(), r, next); err != nil {
			t.Fatal(err)
		}
	}
	fence, err := rdb.Get(context.Background(), engine.CounterKey(engine.Key(DefaultPrefix, "", "k2"))).Int64()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != strconv.FormatInt(fence, 10) || got[1] != "" {
		t.Fatalf("fencing headers upstream = %q, want [%d, \"\"]", got, fence)
	}
}

// Each prefix has its own fencing counters, <prefix>{<h4>}fence, holding
// the last token issued; the released lock leaves nothing else behind.
func TestPrefixNamesFenceCounter(t *testing.T) {
	srv, rdb := newRedis(t)
	h := unitHandler(t, srv.Addr, func(h *Handler) { h.Prefix = "shop:" })
	var sent string
	r, _ := unitRequest("POST", "k-prefix", "")
	err := h.ServeHTTP(httptest.NewRecorder(), r, caddyhttp.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) error {
		sent = r.Header.Get("Fencing-Token")
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	counter := engine.CounterKey(engine.Key("shop:", "", "k-prefix"))
	if !strings.HasPrefix(counter, "shop:{") {
		t.Fatalf("counter %q is not under the prefix", counter)
	}
	if got := rdb.Get(ctx, counter).Val(); got == "" || got != sent {
		t.Fatalf("%s = %q, fencing header upstream %q: want the same token", counter, got, sent)
	}
	if keys := rdb.Keys(ctx, "*").Val(); len(keys) != 1 {
		t.Fatalf("keys after the request: %v, want only %s", keys, counter)
	}
}

// No fencing token reaches anything on a replay, and each execution has
// its own.
func TestIdempotencyFencing(t *testing.T) {
	t.Parallel()
	srv, _ := newRedis(t)
	be := chargeBackend(t)
	s := startCaddySite(t, paySite(srv.Addr, be.hostPort(), storedAnswers()), siteOptions{})
	s.do("POST", "/pay", `{}`, "Idempotency-Key", "f1", "Fencing-Token", "1")
	s.do("POST", "/pay", `{}`, "Idempotency-Key", "f1")
	reqs := be.requests()
	if len(reqs) != 1 {
		t.Fatalf("backend reached %d times", len(reqs))
	}
	if f := fence(t, reqs[0].Fencing); f <= 1 {
		t.Fatalf("fencing token %d: the client's own passed", f)
	}
	if !bytes.Contains(reqs[0].Body, []byte("{}")) {
		t.Fatalf("body upstream %q", reqs[0].Body)
	}
}
