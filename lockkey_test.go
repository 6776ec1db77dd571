package redislock

// The lock key of a request: from a header or the JSON body, missing (400,
// or passed on unlocked with missing_key pass, never the shared lock of an
// empty value), ambiguous (a repeated header, duplicate JSON names; numbers
// are keys by value) or unreadable (not JSON, over max_body, a body that
// stalls), and the body handed on intact after it was read for the key.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
)

func TestMissingKey(t *testing.T) {
	t.Parallel()
	srv, rdb := newRedis(t)
	be := newRecorder(t, nil)
	s := startCaddySite(t, fmt.Sprintf(`	redis_lock /pay* {http.request.header.Idempotency-Key} {
		redis %[1]s
	}
	redis_lock /orders* order:{http.redis_lock.json.order_id} {
		redis %[1]s
	}
	redis_lock /open* {http.request.header.Idempotency-Key} {
		redis %[1]s
		missing_key pass
	}
	header >X-Lock-Result {http.redis_lock.result}
	reverse_proxy %[2]s`, srv.Addr, be.hostPort()), siteOptions{})

	t.Run("absent header", func(t *testing.T) {
		expectProblem(t, s.do("POST", "/pay", `{}`), http.StatusBadRequest)
		expectProblem(t, s.do("POST", "/pay", `{}`, "Idempotency-Key", ""), http.StatusBadRequest)
	})
	for _, body := range []string{`{}`, `{"order_id":null}`, `{"order_id":""}`, `{"other":"x"}`} {
		t.Run("json "+body, func(t *testing.T) {
			expectProblem(t, s.do("POST", "/orders", body), http.StatusBadRequest)
		})
	}
	if be.executions() != 0 {
		t.Fatalf("backend called %d times for requests without a key", be.executions())
	}
	// The empty key must never become the shared lock "order:".
	if n := rdb.DBSize(context.Background()).Val(); n != 0 {
		t.Fatalf("%d keys in Redis: a lock was taken for an empty key", n)
	}
	if keys := lockKeys(t, rdb, DefaultPrefix); len(keys) != 0 {
		t.Fatalf("lock keys left: %v", keys)
	}

	t.Run("missing_key pass", func(t *testing.T) {
		r := s.do("POST", "/open", `{}`, "Fencing-Token", "12345")
		if r.Status != 200 {
			t.Fatalf("missing_key pass: %s", r)
		}
		reqs := be.requests()
		if len(reqs) != 1 {
			t.Fatalf("backend executions = %d, want 1", len(reqs))
		}
		if len(reqs[0].Fencing) != 0 {
			t.Errorf("unlocked request reached the backend with Fencing-Token %q (the client's must be removed)", reqs[0].Fencing)
		}
		if got := r.Header.Get("X-Lock-Result"); got != "bypassed" {
			t.Errorf("{http.redis_lock.result} = %q, want bypassed", got)
		}
		// With a key, the same route locks.
		r = s.do("POST", "/open", `{}`, "Idempotency-Key", "now-locked")
		if r.Status != 200 || r.Header.Get("X-Lock-Result") != "acquired" {
			t.Fatalf("keyed request on a pass route: %s", r)
		}
	})
}

func TestJSONKey(t *testing.T) {
	t.Parallel()
	_, rdb := newRedis(t)
	be := newRecorder(t, nil)
	s := startCaddySite(t, fmt.Sprintf(`	redis_lock /orders* order:{http.redis_lock.json.order_id} {
		redis %[1]s
		max_body 1KiB
	}
	redis_lock /nested* {http.redis_lock.json.customer.id}/{http.redis_lock.json.items.1.sku} {
		redis %[1]s
	}
	redis_lock /tenant* {
		key order:{http.redis_lock.json.order_id}
		scope {http.request.header.X-Tenant}
		redis %[1]s
	}
	header >X-Lock-Key {http.redis_lock.key}
	reverse_proxy %[2]s`, rdb.Options().Addr, be.hostPort()), siteOptions{})

	t.Run("not JSON", func(t *testing.T) {
		expectProblem(t, s.do("POST", "/orders", `order_id=7`, "Content-Type", "application/x-www-form-urlencoded"), http.StatusBadRequest)
		expectProblem(t, s.do("POST", "/orders", `{"order_id": "7"`), http.StatusBadRequest)
		expectProblem(t, s.do("POST", "/orders", ``), http.StatusBadRequest)
	})
	t.Run("body over max_body", func(t *testing.T) {
		big := `{"order_id":"big","pad":"` + strings.Repeat("x", 2048) + `"}`
		expectProblem(t, s.do("POST", "/orders", big), http.StatusRequestEntityTooLarge)
	})
	if be.executions() != 0 {
		t.Fatalf("backend called %d times for rejected bodies", be.executions())
	}
	t.Run("body reaches the backend intact", func(t *testing.T) {
		body := "{\n  \"pad\": \"" + strings.Repeat("é€", 100) + "\",\n  \"order_id\" : \"ord-1\" , \"amount\": 12.50 }\n"
		if len(body) > 1024 {
			t.Fatalf("test body of %d bytes exceeds max_body", len(body))
		}
		r := s.do("POST", "/orders", body)
		if r.Status != 200 {
			t.Fatalf("%s", r)
		}
		reqs := be.requests()
		if got := string(reqs[len(reqs)-1].Body); got != body {
			t.Fatalf("backend body differs:\n got %q\nwant %q", got, body)
		}
		if got, want := r.Header.Get("X-Lock-Key"), defaultKey("order:ord-1"); got != want {
			t.Errorf("{http.redis_lock.key} = %q, want %q", got, want)
		}
	})
	t.Run("numeric id", func(t *testing.T) {
		r := s.do("POST", "/orders", `{"order_id": 42}`)
		if r.Status != 200 || !strings.HasPrefix(r.Header.Get("X-Lock-Key"), DefaultPrefix+"{") {
			t.Fatalf("numeric order_id: %s", r)
		}
	})
	t.Run("nested path and array index", func(t *testing.T) {
		body := `{"customer":{"id":"c-7"},"items":[{"sku":"a"},{"sku":"b"}]}`
		holdLock(t, rdb, defaultKey("c-7/b"), 5*time.Second)
		r := s.do("POST", "/nested", body)
		expectProblem(t, r, http.StatusConflict)
		r = s.do("POST", "/nested", `{"customer":{"id":"c-7"},"items":[{"sku":"b"},{"sku":"c"}]}`)
		if r.Status != 200 {
			t.Fatalf("other sku: %s", r)
		}
		if got, want := r.Header.Get("X-Lock-Key"), defaultKey("c-7/c"); got != want {
			t.Errorf("{http.redis_lock.key} = %q, want %q", got, want)
		}
		expectProblem(t, s.do("POST", "/nested", `{"customer":{"id":"c-7"},"items":[{"sku":"a"}]}`), http.StatusBadRequest)
	})
	t.Run("tenant scope", func(t *testing.T) {
		holdLock(t, rdb, engine.Key(DefaultPrefix, "tenant-a", "order:7"), 5*time.Second)
		expectProblem(t, s.do("POST", "/tenant", `{"order_id":"7"}`, "X-Tenant", "tenant-a"), http.StatusConflict)
		r := s.do("POST", "/tenant", `{"order_id":"7"}`, "X-Tenant", "tenant-b")
		if r.Status != 200 {
			t.Fatalf("same order of another tenant: %s", r)
		}
		if got, want := r.Header.Get("X-Lock-Key"), engine.Key(DefaultPrefix, "tenant-b", "order:7"); got != want {
			t.Errorf("{http.redis_lock.key} = %q, want %q", got, want)
		}
	})
}

// A value the key reads must mean one thing: a repeated header, an
// ambiguous JSON field or two spellings of one number cannot lock apart
// what the backend reads as one order.
func TestKeyIsUnambiguous(t *testing.T) {
	srv, rdb := newRedis(t)
	be := newRecorder(t, nil)
	s := startCaddySite(t, fmt.Sprintf(`	redis_lock /pay* {http.request.header.Idempotency-Key} {
		redis %[1]s
	}
	redis_lock /orders* order:{http.redis_lock.json.order_id} {
		redis %[1]s
	}
	reverse_proxy %[2]s`, srv.Addr, be.hostPort()), siteOptions{})

	t.Run("repeated header", func(t *testing.T) {
		expectProblem(t, s.do("POST", "/pay", `{}`, "Idempotency-Key", "K", "Idempotency-Key", "zzz"), http.StatusBadRequest)
	})
	for _, body := range []string{
		`{"order_id":"zz","ORDER_ID":"q"}`,
		`{"order_id":"zz","order_id":"q"}`,
		`{"Order_Id":"q"}`,
	} {
		t.Run("json "+body, func(t *testing.T) {
			expectProblem(t, s.do("POST", "/orders", body), http.StatusBadRequest)
		})
	}
	if be.executions() != 0 {
		t.Fatalf("ambiguous keys reached the backend %d times", be.executions())
	}
	t.Run("numbers by value", func(t *testing.T) {
		holdLock(t, rdb, defaultKey("order:1000"), 5*time.Second)
		for _, n := range []string{"1000", "1e3", "1000.0", "10000e-1"} {
			r := s.do("POST", "/orders", `{"order_id":`+n+`}`)
			expectProblem(t, r, http.StatusConflict)
		}
	})
}

// A request whose body stalls until the server's read timeout gets 408,
// never the 200 of an empty response.
func TestStalledBodyIsNot200(t *testing.T) {
	srv, _ := newRedis(t)
	be := newRecorder(t, nil)
	s := startCaddySite(t, fmt.Sprintf(`	redis_lock /orders* order:{http.redis_lock.json.order_id} {
		redis %s
	}
	reverse_proxy %s`, srv.Addr, be.hostPort()), siteOptions{global: `	servers {
		timeouts {
			read_body 500ms
		}
	}`})
	conn, err := net.Dial("tcp", strings.TrimPrefix(s.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	fmt.Fprintf(conn, "POST /orders HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 40\r\n\r\n{\"order_id\":")
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no response to a stalled body: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	expectProblem(t, &response{Status: resp.StatusCode, Header: resp.Header, Body: string(body)}, http.StatusRequestTimeout)
	t.Logf("stalled body answered %d after %v", resp.StatusCode, time.Since(start))
	if be.executions() != 0 {
		t.Fatal("a request with a stalled body reached the backend")
	}
}

func TestJSONBodyHandedOn(t *testing.T) {
	srv, _ := newRedis(t)
	h := unitHandler(t, srv.Addr, func(h *Handler) {
		h.Key = "order:{http.redis_lock.json.order_id}"
		h.MaxBody = 64
	})
	const doc = `{"order_id": 12, "note": "x"}`
	for _, tt := range []struct {
		body   string
		status int
	}{
		{doc, 200},
		{`{"note": "no id"}`, 400},
		{`{"order_id": null}`, 400},
		{"order_id=12", 400},
		{"", 400},
		{`{"order_id": 12, "pad": "` + strings.Repeat("x", 64) + `"}`, 413},
	} {
		rec := httptest.NewRecorder()
		r, _ := unitRequest("POST", "", tt.body)
		var seenBody string
		h.ServeHTTP(rec, r, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			b, _ := io.ReadAll(r.Body)
			seenBody = string(b)
			return nil
		}))
		if rec.Code != tt.status {
			t.Errorf("body %q: status %d, want %d", tt.body, rec.Code, tt.status)
		}
		if tt.status == 200 && seenBody != tt.body {
			t.Errorf("next read %q, want the body intact", seenBody)
		}
	}
}
