package redislock

// The handler as the Redis user docs/topologies.md documents, over TLS with a
// private CA and a client certificate; and what a wrong password or an
// untrusted server certificate looks like to the client and in the log.

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

// minimalACL is the rule for the lock's Redis user in docs/topologies.md
// (TestDocsMinimalACL checks that they agree): its key
// pattern, the commands of its scripts and release, and the lock channels
// a waiter is woken on.
const minimalACL = "on resetkeys ~redis_lock:* resetchannels &redis_lock:* -@all " +
	"+evalsha +eval +hdel +exists +time +set +get +incr +hset +hkeys +pexpire +del +hget +hgetall +pttl +hexists +getrange +spublish +ssubscribe +wait"

const aclPassword = "correct-horse-battery"

func tlsRedisBlock(srv *redistest.TLSServer, password string) string {
	return fmt.Sprintf(`redis %s {
			username caddy
			password %s
			tls {
				ca %s
				cert %s
				key %s
			}
			timeout 500ms
		}`, srv.Addr, password, srv.CAFile, srv.CertFile, srv.KeyFile)
}

func TestTLSWithMinimalACLUser(t *testing.T) {
	t.Parallel()
	srv := redistest.StartTLS(t)
	if err := redistest.SetACLUser(context.Background(), srv.Addr, srv.ClientConfig(), "caddy >"+aclPassword+" "+minimalACL); err != nil {
		t.Fatal(err)
	}
	be := chargeBackend(t)
	s := startCaddySite(t, fmt.Sprintf(`	redis_lock /lock* {http.request.header.Idempotency-Key} {
		%[1]s
	}
	redis_lock /pay* {http.request.header.Idempotency-Key} {
		%[1]s
		idempotency
	}
	reverse_proxy %[2]s`, tlsRedisBlock(srv, aclPassword), be.hostPort()), siteOptions{})
	for i := range 2 {
		if r := s.do("POST", "/lock", `{}`, "Idempotency-Key", fmt.Sprintf("tls-lock-%d", i)); r.Status != http.StatusCreated {
			t.Fatalf("lock as the minimal user over TLS: %s", r)
		}
	}
	first := s.do("POST", "/pay", `{}`, "Idempotency-Key", "tls-idem")
	again := s.do("POST", "/pay", `{}`, "Idempotency-Key", "tls-idem")
	if first.Status != http.StatusCreated || again.Body != first.Body || again.Header.Get(replayedHeader) != "true" {
		t.Fatalf("idempotency as the minimal user over TLS: %s then %s", first, again)
	}
	// The user cannot touch keys outside its prefix.
	v, err := redistest.DoString(context.Background(), srv.Addr, srv.ClientConfig(), "ACL", "DRYRUN", "caddy", "SET", "other:key", "1")
	if err != nil || v == "OK" {
		t.Fatalf("ACL DRYRUN of a write outside redis_lock:* = %q, %v; want it refused", v, err)
	}
}

// warned provisions a handler on redisBlock's settings, sends one request
// and returns the status and the handler's warnings.
func warned(t *testing.T, srv *redistest.TLSServer, password string) (int, []observer.LoggedEntry) {
	t.Helper()
	h := unitHandler(t, srv.Addr, func(h *Handler) {
		h.Redis.Username, h.Redis.Password = "caddy", password
		h.Redis.TLS = &RedisTLS{CA: srv.CAFile, Cert: srv.CertFile, Key: srv.KeyFile}
	})
	core, logs := observer.New(zap.WarnLevel)
	h.logger = zap.New(core)
	rec := httptest.NewRecorder()
	r, _ := unitRequest("POST", "k", "")
	if err := h.ServeHTTP(rec, r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })); err != nil {
		t.Fatal(err)
	}
	return rec.Code, logs.All()
}

// A wrong password and an untrusted server certificate: 503 for the
// client, the reason in the log, and no secret in either.
func TestTLSAndACLFailures(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, password, reason string
		untrusted              bool
	}{
		{"wrong password", "wrong-password-123", "WRONGPASS", false},
		{"untrusted certificate", aclPassword, "certificate", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var srv *redistest.TLSServer
			if tc.untrusted {
				srv = redistest.StartTLSUntrusted(t)
			} else {
				srv = redistest.StartTLS(t)
			}
			if !tc.untrusted { // there, the handshake fails before any user
				if err := redistest.SetACLUser(context.Background(), srv.Addr, srv.ClientConfig(), "caddy >"+aclPassword+" "+minimalACL); err != nil {
					t.Fatal(err)
				}
			}
			status, logs := warned(t, srv, tc.password)
			if status != http.StatusServiceUnavailable {
				t.Fatalf("status %d, want 503", status)
			}
			if len(logs) != 1 {
				t.Fatalf("%d warnings, want 1", len(logs))
			}
			line := fmt.Sprint(logs[0].Message, logs[0].ContextMap())
			if !strings.Contains(line, tc.reason) {
				t.Errorf("warning %q does not say why (%s)", line, tc.reason)
			}
			for _, secret := range []string{tc.password, aclPassword} {
				if strings.Contains(line, secret) {
					t.Errorf("warning leaks a password: %q", line)
				}
			}
		})
	}
}

// As the minimal user, a duplicate in progress gets 409, and one that
// waits is woken: the refusal's and the wake-up's commands are in the rule.
func TestMinimalACLUserWaits(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	if err := redistest.SetACLUser(context.Background(), srv.Addr, nil, "caddy >"+aclPassword+" "+minimalACL); err != nil {
		t.Fatal(err)
	}
	backend := firstSlow(t, 300*time.Millisecond)
	auth := []string{"username caddy", "password " + aclPassword}
	sites := startCaddySites(t, siteOptions{admin: true},
		paySite(srv.Addr, backend.URL, redisLines(auth...), lockLines("wait 3s")),
		paySite(srv.Addr, backend.URL, redisLines(auth...), lockLines("wait 3s"), idempotent()),
		paySite(srv.Addr, backend.URL, redisLines(auth...), lockLines("name acl"), idempotent()))
	for i, mode := range []string{"lock", "idempotency"} {
		// Woken, a few ms; polling, up to 244ms (TestWaitWokenByRelease).
		if lags := waitLags(t, sites[i], "acl-"+mode, 1, 300*time.Millisecond); lags[0] > 100*time.Millisecond {
			t.Errorf("%s: the waiter answered %v after the holder: not woken", mode, lags[0])
		}
	}
	// Without wait, the duplicate of a request in progress is 409.
	done := make(chan struct{})
	go func() {
		defer close(done)
		if r := sites[2].do("POST", "/pay", `{}`, "Idempotency-Key", "acl-busy"); r.Status != 200 {
			t.Errorf("holder: %s", r)
		}
	}()
	time.Sleep(100 * time.Millisecond)
	expectProblem(t, sites[2].do("POST", "/pay", `{}`, "Idempotency-Key", "acl-busy"), http.StatusConflict)
	<-done
	// The admin API's lookup and removal run as the same user.
	if st := sites[2].lookup(keyQuery("key", "acl-busy", "name", "acl")); st.Record.State != stateCompleted {
		t.Errorf("admin lookup: %+v", st.Record)
	}
	if r := sites[2].admin("DELETE", "/redis_lock/keys", keyQuery("key", "acl-busy", "name", "acl"), nil); r.Status != http.StatusOK {
		t.Errorf("admin DELETE: %s", r)
	}
}
