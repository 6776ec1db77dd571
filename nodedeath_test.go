package redislock

// A record outlives its Caddy node: real Caddy processes on one Redis, a
// backend that charges for a second whatever happens to the connection (as
// a legacy backend does), and the node that holds a payment killed while
// the payment is at the backend. Its retries, on other nodes, never charge
// again: 409 while the dead holder's lease runs and a lease more (for a
// holder that is only late), then 502 outcome-unknown for as long as the
// record is kept, until an operator clears it.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

// chargeFor is how long the backend takes to charge (legacyCharge: to the
// end once entered, whether Caddy is still there or not).
const chargeFor = time.Second

// deathMode is one way of keying the payments: by the Idempotency-Key, or
// per account with the Idempotency-Key's record within it.
type deathMode struct {
	name  string
	site  func(redisAddr, backend, extra string) string
	query url.Values // the admin lookup of the payment's record
	// recordLock is the Redis key of the record's own lock.
	recordLock string
}

var deathModes = []deathMode{
	{
		name: "idempotency",
		site: func(redisAddr, backend, extra string) string {
			return fmt.Sprintf(`	redis_lock /pay* {http.request.header.Idempotency-Key} {
		redis %s
		ttl 2s
		%s
		idempotency
	}
	reverse_proxy %s`, redisAddr, extra, backend)
		},
		query:      keyQuery("key", "pay-dies"),
		recordLock: defaultKey("pay-dies"),
	},
	{
		name: "per-account",
		site: func(redisAddr, backend, extra string) string {
			return fmt.Sprintf(`	redis_lock /pay* acct:{http.request.header.X-Account} {
		redis %s
		ttl 2s
		%s
		idempotency {
			key {http.request.header.Idempotency-Key}
		}
	}
	reverse_proxy %s`, redisAddr, extra, backend)
		},
		query:      keyQuery("key", "acct:a1", "idempotency_key", "pay-dies"),
		recordLock: engine.Key(DefaultPrefix, defaultKey("acct:a1"), "pay-dies"),
	},
}

// TestNodeDeathAbandonsRecord: node A is SIGKILLed 0.4s into a payment's
// 1s charge. A retry on node B during A's lease gets 409, and so does one
// in the lease after it; a duplicate waiting on node C (wait 8s) is
// answered 502 outcome-unknown once the record is abandoned, within a lease
// of that second retry; every retry after it gets 502 outcome-unknown with
// Stripe-Should-Retry: false, on any node; the backend charged once. The
// admin API shows the record abandoned, and its DELETE lets the next retry
// run.
func TestNodeDeathAbandonsRecord(t *testing.T) {
	t.Parallel()
	bin := buildCaddyBinary(t)
	for _, m := range deathModes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			srv, rdb := newRedis(t)
			be := legacyCharge(t, chargeFor)
			a := startCaddyNode(t, bin, "caddy-a", m.site(srv.Addr, be.hostPort(), ""), nodeOptions{})
			b := startCaddyNode(t, bin, "caddy-b", m.site(srv.Addr, be.hostPort(), ""), nodeOptions{admin: true})
			c := startCaddyNode(t, bin, "caddy-c", m.site(srv.Addr, be.hostPort(), "wait 8s"), nodeOptions{})
			pay := func(node *caddyProcess) (*response, error) {
				return sendRequest(context.Background(), http.DefaultClient, "POST", node.URL+"/pay", `{"amount":1299}`,
					"Idempotency-Key", "pay-dies", "X-Account", "a1")
			}

			first := make(chan error, 1)
			go func() {
				r, err := pay(a)
				if err == nil {
					err = fmt.Errorf("node A answered %s before it was killed", r)
				}
				first <- err
			}()
			be.waitEntered(t, 10*time.Second)
			time.Sleep(400 * time.Millisecond)
			a.kill(t, syscall.SIGKILL)
			if err := <-first; !isConnError(err) {
				t.Fatalf("the client of the killed node: %v, want its connection broken", err)
			}

			// A duplicate that waits, and one that does not, while A's lease
			// runs.
			waited := make(chan *response, 1)
			go func() {
				r, err := pay(c)
				if err != nil {
					t.Errorf("the waiting duplicate on C: %v", err)
				}
				waited <- r
			}()
			r, err := pay(b)
			if err != nil {
				t.Fatal(err)
			}
			if p := expectProblem(t, r, http.StatusConflict); p.Type != problemTypeBase+"in-progress" {
				t.Fatalf("a retry on B during the dead holder's lease: %s, want 409 in-progress", r)
			}

			// The lease ends: a lease more of 409, then the waiting duplicate
			// is answered, and so is every retry.
			redistest.Eventually(t, 10*time.Second, "the dead holder's lease to end", func() bool { return !keyExists(t, rdb, m.recordLock) })
			r, err = pay(b)
			if err != nil {
				t.Fatal(err)
			}
			graceFrom := time.Now()
			if p := expectProblem(t, r, http.StatusConflict); p.Type != problemTypeBase+"in-progress" {
				t.Fatalf("a retry on B just after the dead holder's lease: %s, want 409 in-progress (a lease more for a late holder)", r)
			}
			w := <-waited
			answered := time.Now()
			if w == nil {
				t.FailNow()
			}
			if p := expectProblem(t, w, http.StatusBadGateway); p.Type != problemTypeBase+"outcome-unknown" || w.Header.Get(shouldRetryHeader) != "false" {
				t.Fatalf("the duplicate waiting on C: %s, want 502 outcome-unknown, Stripe-Should-Retry: false", w)
			}
			if late := answered.Sub(graceFrom); late > 2*time.Second+time.Second {
				t.Errorf("the waiting duplicate was answered %v after the lease after the dead holder's, want within that lease (2s) and a second", late)
			}
			for i, node := range []*caddyProcess{b, c, b} {
				r, err := pay(node)
				if err != nil {
					t.Fatal(err)
				}
				if p := expectProblem(t, r, http.StatusBadGateway); p.Type != problemTypeBase+"outcome-unknown" ||
					r.Header.Get(shouldRetryHeader) != "false" || r.Header.Get(replayedHeader) != "true" {
					t.Fatalf("retry %d after the lease: %s, want the stored 502 outcome-unknown", i, r)
				}
			}
			time.Sleep(chargeFor) // the charge begun through A has ended
			if n := be.executions("pay-dies"); n != 1 {
				t.Fatalf("the backend charged %d times, want once", n)
			}
			if keyExists(t, rdb, m.recordLock) {
				t.Fatal("a retry of the abandoned record took its lock")
			}

			// The operator checks the backend and clears the record.
			var st keyState
			if code := adminCall(t, b, "GET", m.query, &st); code != http.StatusOK || st.Record == nil || st.Record.State != stateAbandoned || st.Record.ExpiresInMs <= 0 {
				t.Fatalf("admin lookup: %d %+v, want the record abandoned, with its retention", code, st.Record)
			}
			var removed map[string]any
			if code := adminCall(t, b, "DELETE", m.query, &removed); code != http.StatusOK || removed["state"] != stateAbandoned {
				t.Fatalf("admin DELETE: %d %v, want the abandoned record removed", code, removed)
			}
			r, err = pay(b)
			if err != nil || r.Status != http.StatusOK || r.Header.Get(replayedHeader) != "" {
				t.Fatalf("a retry once the record was cleared: %v %v, want it run", r, err)
			}
			if n := be.executions("pay-dies"); n != 2 {
				t.Fatalf("the backend charged %d times after the DELETE, want twice", n)
			}
			if r, err := pay(c); err != nil || r.Header.Get(replayedHeader) != "true" || r.Header.Get("X-Charge") != "2" {
				t.Fatalf("a retry after it: %v %v, want its answer replayed", r, err)
			}
			if left := lockKeys(t, rdb, DefaultPrefix); len(left) != 0 {
				t.Fatalf("locks left: %v", left)
			}
		})
	}
}

// TestNodeStopDrains: a node stopped with SIGTERM (Caddy's graceful stop)
// while a payment is at the backend finishes it within its grace_period:
// the client gets the answer, and a retry on another node gets it
// replayed. A stop whose grace_period is shorter than the charge is a
// death: the client's connection breaks, and its retries get 409, then 502
// outcome-unknown; the backend charged once either way.
func TestNodeStopDrains(t *testing.T) {
	t.Parallel()
	bin := buildCaddyBinary(t)
	for _, c := range []struct {
		name    string
		grace   time.Duration
		drained bool
	}{
		{"within grace", 5 * time.Second, true},
		{"past grace", 200 * time.Millisecond, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			m := deathModes[0]
			srv, rdb := newRedis(t)
			be := legacyCharge(t, chargeFor)
			a := startCaddyNode(t, bin, "caddy-a", m.site(srv.Addr, be.hostPort(), ""), nodeOptions{grace: c.grace})
			b := startCaddyNode(t, bin, "caddy-b", m.site(srv.Addr, be.hostPort(), ""), nodeOptions{})
			pay := func(node *caddyProcess) (*response, error) {
				return sendRequest(context.Background(), http.DefaultClient, "POST", node.URL+"/pay", `{"amount":1299}`, "Idempotency-Key", "pay-dies")
			}
			type result struct {
				r   *response
				err error
			}
			first := make(chan result, 1)
			go func() {
				r, err := pay(a)
				first <- result{r, err}
			}()
			be.waitEntered(t, 10*time.Second)
			time.Sleep(400 * time.Millisecond)
			if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			got := <-first
			select {
			case <-a.exited:
			case <-time.After(15 * time.Second):
				t.Fatal("node A did not exit after SIGTERM")
			}
			if c.drained {
				if got.err != nil || got.r.Status != http.StatusOK || got.r.Header.Get("X-Charge") != "1" {
					t.Fatalf("the client of the draining node: %v %v, want its 200", got.r, got.err)
				}
				r, err := pay(b)
				if err != nil || r.Header.Get(replayedHeader) != "true" || r.Body != got.r.Body {
					t.Fatalf("a retry on B after the drain: %v %v, want the answer replayed", r, err)
				}
			} else {
				if got.err == nil && got.r.Status == http.StatusOK {
					t.Fatalf("the client of a node stopped past its grace got %s", got.r)
				}
				redistest.Eventually(t, 10*time.Second, "the stopped holder's lease to end", func() bool { return !keyExists(t, rdb, m.recordLock) })
				untilAbandoned(t, 3*time.Second, func() *response {
					r, err := pay(b)
					if err != nil {
						t.Fatal(err)
					}
					return r
				})
			}
			time.Sleep(chargeFor)
			if n := be.executions("pay-dies"); n != 1 {
				t.Fatalf("the backend charged %d times, want once", n)
			}
		})
	}
}

// isConnError reports whether err is a broken connection, as the client of
// a killed node sees it (not an HTTP answer).
func isConnError(err error) bool {
	if err == nil {
		return false
	}
	s := err.Error()
	return strings.Contains(s, "EOF") || strings.Contains(s, "connection reset") || strings.Contains(s, "connection refused")
}

// adminCall sends method to node's /redis_lock/keys with query, decodes the
// JSON answer into out and returns its status.
func adminCall(t *testing.T, node *caddyProcess, method string, query url.Values, out any) int {
	t.Helper()
	req, err := http.NewRequest(method, node.AdminURL+"/redis_lock/keys?"+query.Encode(), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(body, out); err != nil {
		t.Fatalf("%s %s: %v: %s", method, req.URL, err, body)
	}
	return resp.StatusCode
}
