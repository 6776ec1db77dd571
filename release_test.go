package redislock

// The release: before the client's last byte, so that a client that
// retries the moment it has its answer gets the lock; after an upstream
// error, a panic in the next handler or a client gone; and a release on a
// Redis that stopped answering holds the response's end for at most the
// timeout.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/reqlock/caddy-redis-lock/internal/redistest"
	"github.com/reqlock/caddy-redis-lock/lock"
)

func TestReleasedBeforeLastByte(t *testing.T) {
	srv, rdb := newRedis(t)
	h := unitHandler(t, srv.Addr, nil)
	key := lock.Key(DefaultPrefix, "", "k1")

	pw := newProbeWriter()
	var heldAt []bool // per client-side write: was the lock still in Redis?
	pw.onWrite = func([]byte) { heldAt = append(heldAt, keyExists(t, rdb, key)) }
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		w.Header().Set("Content-Length", "11")
		w.Write([]byte("hello"))
		_, err := io.Copy(w, strings.NewReader(" world")) // the ReadFrom path
		return err
	})
	r, repl := unitRequest("POST", "k1", "")
	if err := h.ServeHTTP(pw, r, next); err != nil {
		t.Fatal(err)
	}
	if pw.body.String() != "hello world" {
		t.Fatalf("body %q", pw.body.String())
	}
	if len(heldAt) < 2 || !heldAt[0] || heldAt[len(heldAt)-1] {
		t.Fatalf("lock held at each client write = %v: want held for all but the last, released before it", heldAt)
	}
	if res, _ := repl.GetString(phResult); res != resultAcquired {
		t.Errorf("result %q", res)
	}
	if got, _ := repl.GetString(phKey); got != key {
		t.Errorf("{http.redis_lock.key} = %q, want the hashed key %q", got, key)
	}
}

func TestReleasedWhenNextFailsOrPanics(t *testing.T) {
	srv, rdb := newRedis(t)
	h := unitHandler(t, srv.Addr, nil)
	key := lock.Key(DefaultPrefix, "", "k3")
	boom := errors.New("upstream failed")

	// An error that does not say no backend was reached leaves the outcome
	// unknown: 502 outcome-unknown, as in idempotency mode.
	r, _ := unitRequest("POST", "k3", "")
	pw := newProbeWriter()
	err := h.ServeHTTP(pw, r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return boom }))
	if err != nil || pw.status != http.StatusBadGateway || !strings.Contains(pw.body.String(), "outcome-unknown") || keyExists(t, rdb, key) {
		t.Fatalf("err %v, status %d, lock left %v: want 502 outcome-unknown and the lock released", err, pw.status, keyExists(t, rdb, key))
	}
	// One that says so passes on as it is.
	r, _ = unitRequest("POST", "k3", "")
	refused := caddyhttp.Error(http.StatusServiceUnavailable, boom)
	err = h.ServeHTTP(newProbeWriter(), r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return refused }))
	if !errors.Is(err, boom) || keyExists(t, rdb, key) {
		t.Fatalf("err %v, lock left %v: want next's error and the lock released", err, keyExists(t, rdb, key))
	}

	r, _ = unitRequest("POST", "k3", "")
	func() {
		defer func() {
			if p := recover(); p != "handler panic" {
				t.Errorf("recovered %v, want next's panic re-raised", p)
			}
		}()
		h.ServeHTTP(newProbeWriter(), r, caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error {
			w.Write([]byte("x"))
			panic("handler panic")
		}))
	}()
	if keyExists(t, rdb, key) {
		t.Fatal("lock left in Redis after a panic in next")
	}
}

func TestImmediateRetryAfterResponse(t *testing.T) {
	t.Parallel()
	srv, rdb := newRedis(t)
	big := strings.Repeat("0123456789abcdef", 16<<10) // 256KiB
	be := newRecorder(t, func(w http.ResponseWriter, r *http.Request, s seen) {
		if r.URL.Path == "/pay/big" {
			io.WriteString(w, big)
			return
		}
		io.WriteString(w, "ok")
	})
	s := startCaddySite(t, paySite(srv.Addr, be.hostPort(), lockLines("ttl 30s")), siteOptions{})
	for _, path := range []string{"/pay/small", "/pay/big"} {
		for i := range 40 {
			r := s.do("POST", path, `{}`, "Idempotency-Key", "retry-"+path)
			if r.Status != 200 {
				t.Fatalf("%s attempt %d: %d (the lock outlived the response)", path, i, r.Status)
			}
			if path == "/pay/big" && len(r.Body) != len(big) {
				t.Fatalf("%s: body of %d bytes, want %d", path, len(r.Body), len(big))
			}
		}
	}
	if keys := lockKeys(t, rdb, DefaultPrefix); len(keys) != 0 {
		t.Fatalf("lock keys left: %v", keys)
	}
}

func TestReleasedAfterUpstreamFailure(t *testing.T) {
	t.Parallel()
	srv, rdb := newRedis(t)
	cancelled := make(chan struct{}, 1)
	finish := make(chan struct{}, 1)
	be := newRecorder(t, func(w http.ResponseWriter, r *http.Request, s seen) {
		switch r.URL.Path {
		case "/pay/500":
			http.Error(w, "boom", http.StatusInternalServerError)
		case "/pay/hang":
			select {
			case <-r.Context().Done():
				cancelled <- struct{}{}
			case <-finish:
				io.WriteString(w, "charged")
			case <-time.After(20 * time.Second):
			}
		default:
			io.WriteString(w, "ok")
		}
	})
	deadPort := mustFreePort(t)
	s := startCaddySite(t, fmt.Sprintf(`	redis_lock {http.request.header.Idempotency-Key} {
		redis %s
		ttl 30s
	}
	handle /gone* {
		reverse_proxy 127.0.0.1:%d
	}
	reverse_proxy %s`, srv.Addr, deadPort, be.hostPort()), siteOptions{})

	// ttl 30s: a key that goes away did so by release, not by expiry.
	t.Run("backend 500", func(t *testing.T) {
		for i := range 3 {
			r := s.do("POST", "/pay/500", `{}`, "Idempotency-Key", "e500")
			if r.Status != 500 {
				t.Fatalf("attempt %d: %s", i, r)
			}
			if keyExists(t, rdb, defaultKey("e500")) {
				t.Fatal("lock still held after the backend answered 500")
			}
		}
	})
	t.Run("backend down", func(t *testing.T) {
		for i := range 3 {
			r := s.do("POST", "/gone", `{}`, "Idempotency-Key", "e502")
			if r.Status != http.StatusBadGateway {
				t.Fatalf("attempt %d: %s", i, r)
			}
			if keyExists(t, rdb, defaultKey("e502")) {
				t.Fatal("lock still held after reverse_proxy failed")
			}
		}
	})
	t.Run("client gone", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			_, err := s.send(ctx, "POST", "/pay/hang", `{}`, "Idempotency-Key", "gone")
			errc <- err
		}()
		for s := be.waitEntered(t, 10*time.Second); s.Path != "/pay/hang"; s = be.waitEntered(t, 10*time.Second) {
		}
		if !keyExists(t, rdb, defaultKey("gone")) {
			t.Fatal("lock not held while the request is in flight")
		}
		cancel()
		<-errc
		// The backend may be charging: the request runs on, locked.
		select {
		case <-cancelled:
			t.Fatal("the upstream request was cancelled when the client left")
		case <-time.After(time.Second):
		}
		if !keyExists(t, rdb, defaultKey("gone")) {
			t.Fatal("lock freed while the backend still runs")
		}
		if r := s.do("POST", "/pay/ok", `{}`, "Idempotency-Key", "gone"); r.Status != http.StatusConflict {
			t.Fatalf("a duplicate while the backend runs for a client that left: %s", r)
		}
		finish <- struct{}{}
		redistest.Eventually(t, 5*time.Second, "lock released once the backend answered", func() bool {
			return !keyExists(t, rdb, defaultKey("gone"))
		})
		if r := s.do("POST", "/pay/ok", `{}`, "Idempotency-Key", "gone"); r.Status != 200 {
			t.Fatalf("retry after the backend answered: %s", r)
		}
	})
}

// A release on a Redis that stopped answering holds the end of the response
// for at most the timeout.
func TestReleaseHoldsResponseAtMostTimeout(t *testing.T) {
	srv, _ := newRedis(t)
	wrote := make(chan time.Time, 1)
	be := newRecorder(t, func(w http.ResponseWriter, r *http.Request, _ seen) {
		if r.URL.Path == "/pay/pause" {
			_ = srv.Pause()
			wrote <- time.Now()
		}
		io.WriteString(w, "charged")
	})
	s := startCaddySite(t, paySite(srv.Addr, be.hostPort(), faultTimeouts, lockLines("ttl 3s")), siteOptions{})
	if r := s.do("POST", "/pay", `{}`, "Idempotency-Key", "warm"); r.Status != 200 {
		t.Fatalf("warm-up: %s", r)
	}
	defer srv.Resume()
	r := s.do("POST", "/pay/pause", `{}`, "Idempotency-Key", "release")
	end := time.Now()
	_ = srv.Resume()
	if r.Status != 200 || r.Body != "charged" {
		t.Fatalf("response: %s", r)
	}
	if d := end.Sub(<-wrote); d > redisTimeout+slack {
		t.Errorf("the response ended %v after the backend answered, want at most the %v timeout", d, redisTimeout)
	} else {
		t.Logf("response end held %v by the release on a paused Redis", d)
	}
}
