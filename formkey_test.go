package redislock

// Keys from application/x-www-form-urlencoded bodies:
// {http.redis_lock.form.<field>}, through Caddy against a real Redis.

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// A request without a body (the checkout page's GET on the path its form
// posts to) has a missing key, not an invalid form or JSON body:
// missing_key pass passes it, reject answers 400 missing-key.
func TestBodylessKeyMissing(t *testing.T) {
	t.Parallel()
	_, rdb := newRedis(t)
	be := newRecorder(t, nil)
	s := startCaddySite(t, fmt.Sprintf(`	redis_lock /form-pass* {http.redis_lock.form.checkout_token} {
		redis %[1]s
		missing_key pass
	}
	redis_lock /form-reject* {http.redis_lock.form.checkout_token} {
		redis %[1]s
	}
	redis_lock /json-pass* {http.redis_lock.json.order_id} {
		redis %[1]s
		missing_key pass
	}
	redis_lock /json-reject* {http.redis_lock.json.order_id} {
		redis %[1]s
	}
	reverse_proxy %[2]s`, rdb.Options().Addr, be.hostPort()), siteOptions{})
	for _, method := range []string{"GET", "POST", "DELETE"} {
		for _, kind := range []string{"form", "json"} {
			if r := s.do(method, "/"+kind+"-pass", ""); r.Status != http.StatusOK {
				t.Errorf("%s /%s-pass without a body: %s, want it passed on", method, kind, r)
			}
			if p := expectProblem(t, s.do(method, "/"+kind+"-reject", ""), http.StatusBadRequest); !strings.HasSuffix(p.Type, "#missing-key") {
				t.Errorf("%s /%s-reject without a body: %s, want missing-key", method, kind, p.Type)
			}
		}
	}
	// A body that is there and malformed is still invalid.
	expectProblem(t, s.do("POST", "/form-pass", "a=%zz", "Content-Type", "application/x-www-form-urlencoded"), http.StatusBadRequest)
	expectProblem(t, s.do("POST", "/json-pass", "{", "Content-Type", "application/json"), http.StatusBadRequest)
}

func TestFormKey(t *testing.T) {
	t.Parallel()
	_, rdb := newRedis(t)
	be := newRecorder(t, nil)
	s := startCaddySite(t, fmt.Sprintf(`	redis_lock /charges* order:{http.redis_lock.form.order_id} {
		redis %[1]s
		max_body 1KiB
	}
	redis_lock /meta* {http.redis_lock.form.metadata[order_id]} {
		redis %[1]s
		idempotency
	}
	header >X-Lock-Key {http.redis_lock.key}
	reverse_proxy %[2]s`, rdb.Options().Addr, be.hostPort()), siteOptions{})
	form := func(path, body string, hdr ...string) *response {
		return s.do("POST", path, body, append([]string{"Content-Type", "application/x-www-form-urlencoded"}, hdr...)...)
	}

	t.Run("key", func(t *testing.T) {
		body := "amount=1000&order_id=o-7&currency=usd"
		r := form("/charges", body)
		if r.Status != 200 || r.Header.Get("X-Lock-Key") != defaultKey("order:o-7") {
			t.Fatalf("%s, want the lock of order:o-7", r)
		}
		// The body reaches the backend byte for byte.
		reqs := be.requests()
		if got := string(reqs[len(reqs)-1].Body); got != body {
			t.Errorf("backend got %q, want %q", got, body)
		}
		// Escapes are decoded, as a backend reads them.
		if r := form("/charges", "order_id=o%2D7"); r.Header.Get("X-Lock-Key") != defaultKey("order:o-7") {
			t.Errorf("escaped value: %s", r)
		}
		// Names are case-sensitive: ORDER_ID is another field.
		expectProblem(t, form("/charges", "ORDER_ID=o-7"), http.StatusBadRequest)
	})
	t.Run("brackets taken exactly", func(t *testing.T) {
		r := form("/meta", url.Values{"metadata[order_id]": {"m-1"}, "amount": {"5"}}.Encode())
		if r.Status != 200 || r.Header.Get("X-Lock-Key") != defaultKey("m-1") {
			t.Fatalf("%s, want the lock of m-1", r)
		}
		again := form("/meta", url.Values{"metadata[order_id]": {"m-1"}, "amount": {"5"}}.Encode())
		if again.Header.Get(replayedHeader) != "true" {
			t.Errorf("the retry of a form charge: %s, want a replay", again)
		}
	})
	t.Run("missing or empty", func(t *testing.T) {
		for _, body := range []string{"amount=5", "order_id=", "order_id&amount=5", ""} {
			if p := expectProblem(t, form("/charges", body), http.StatusBadRequest); !strings.HasSuffix(p.Type, "#missing-key") {
				t.Errorf("%q: %s, want missing-key", body, p.Type)
			}
		}
	})
	t.Run("ambiguous", func(t *testing.T) {
		for _, body := range []string{
			"order_id=a&order_id=b", // twice
			"order_id=a&order.id=b", // PHP: order_id
			"order_id=a&order+id=b", // PHP: a space
			"order_id=a&order_id[]=b",
			"order.id[]=b&order_id=a",
		} {
			if p := expectProblem(t, form("/charges", body), http.StatusBadRequest); !strings.HasSuffix(p.Type, "#ambiguous-key") {
				t.Errorf("%q: %s, want ambiguous-key", body, p.Type)
			}
		}
		// Other names are no conflict.
		if r := form("/charges", "order_id=a&order_ids=b&orderid=c&order_id_x=d"); r.Status != 200 {
			t.Errorf("distinct names: %s", r)
		}
	})
	t.Run("not a form", func(t *testing.T) {
		before := be.executions()
		for _, tc := range []struct{ body, ctype string }{
			{`{"order_id":"o-7"}`, "application/json"},
			{"order_id=o-7", "text/plain"},
			{"order_id=o-7", ""},
			{"order_id=%zz", "application/x-www-form-urlencoded"},
			{"order_id=o-7;x=1", "application/x-www-form-urlencoded"},
		} {
			r := s.do("POST", "/charges", tc.body, "Content-Type", tc.ctype)
			if p := expectProblem(t, r, http.StatusBadRequest); !strings.HasSuffix(p.Type, "#invalid-form") {
				t.Errorf("%q as %q: %s, want invalid-form", tc.body, tc.ctype, p.Type)
			}
		}
		expectProblem(t, form("/charges", "order_id=o-7&pad="+strings.Repeat("x", 2048)), http.StatusRequestEntityTooLarge)
		if n := be.executions() - before; n != 0 {
			t.Errorf("the backend got %d rejected bodies", n)
		}
	})
	// With a charset parameter the type is still a form.
	if r := s.do("POST", "/charges", "order_id=cs", "Content-Type", "application/x-www-form-urlencoded; charset=utf-8"); r.Status != 200 {
		t.Errorf("a form with a charset: %s", r)
	}
}
