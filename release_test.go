package redislock

// The release through Caddy: a client that retries the moment it has its
// answer gets the lock; after an upstream error or a client gone; and a
// release on a Redis that stopped answering holds the response's end for
// at most the timeout. The release before the last byte, after next fails
// or panics, is in handler_test.go.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

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
