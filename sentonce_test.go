package redislock

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// resetBackend is a payment backend that speaks HTTP/1.1 on raw
// connections, keeps them alive, and records every request it reads. A
// charge (any path but /warm) that arrives on a connection which already
// served a request is recorded and then answered with a TCP reset, as a
// backend that crashes, or a load balancer that drops the connection,
// after reading it. On a fresh connection a charge is answered 201, so a
// second sending shows as a second execution with a 201.
type resetBackend struct {
	ln net.Listener

	mu    sync.Mutex
	execs map[string]int // charges read, by path
}

func newResetBackend(t *testing.T) *resetBackend {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &resetBackend{ln: ln, execs: map[string]int{}}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go b.serve(c.(*net.TCPConn))
		}
	}()
	return b
}

func (b *resetBackend) serve(c *net.TCPConn) {
	defer c.Close()
	br := bufio.NewReader(c)
	for served := 0; ; served++ {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		if strings.HasSuffix(req.URL.Path, "/warm") {
			time.Sleep(20 * time.Millisecond) // concurrent warm-ups take a connection each
			fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nwarm")
			continue
		}
		b.mu.Lock()
		b.execs[req.URL.Path]++
		n := b.execs[req.URL.Path]
		b.mu.Unlock()
		if served > 0 {
			_ = c.SetLinger(0) // close with RST: the answer is lost
			return
		}
		body := fmt.Sprintf(`{"id":"ch_%d","object":"charge","status":"succeeded"}`, n)
		fmt.Fprintf(c, "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	}
}

func (b *resetBackend) executions(path string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.execs[path]
}

// A charge whose kept-alive upstream connection is reset after the backend
// read it reaches the backend once, on every locked route: lock-only or
// idempotency, a header or body key, with or without a body, and through
// reverse_proxy's own retries. Without the guard, Go's transport re-sends
// it on a new connection (the request carries an Idempotency-Key and its
// body can be read again, or it has none) and the backend charges twice.
func TestSentOnceOnResetConnection(t *testing.T) {
	t.Parallel()
	srv, _ := newRedis(t)
	be := newResetBackend(t)
	up := be.ln.Addr().String()
	lock := func(key, extra string) string {
		return fmt.Sprintf("redis_lock %s {\n\t\t\tredis %s\n%s\t\t}", key, srv.Addr, extra)
	}
	idem := "\t\t\tidempotency\n"
	s := startCaddySite(t, fmt.Sprintf(`
	handle /lock/* {
		%s
		reverse_proxy %s
	}
	handle /lockjson/* {
		%s
		reverse_proxy %s
	}
	handle /idem/* {
		%s
		reverse_proxy %s
	}
	handle /retries/* {
		%s
		reverse_proxy %s {
			lb_retries 2
			lb_retry_match {
				method POST
			}
		}
	}
	handle /dead/* {
		%s
		reverse_proxy 127.0.0.1:1 %s {
			lb_policy first
			lb_retries 1
			fail_duration 1m
		}
	}`,
		lock("{http.request.header.Idempotency-Key}", ""), up,
		lock("order:{http.redis_lock.json.order_id}", ""), up,
		lock("{http.request.header.Idempotency-Key}", idem), up,
		lock("{http.request.header.Idempotency-Key}", ""), up,
		lock("{http.request.header.Idempotency-Key}", idem), up,
	), siteOptions{})

	cases := []struct {
		name, method, path, body string
		idle                     int // upstream connections left idle before the charge
		idempotency              bool
	}{
		{"lock-only, header key, JSON body", "POST", "/lock/body", `{"amount":1299}`, 1, false},
		{"lock-only, header key, no body", "POST", "/lock/nobody", "", 1, false},
		{"lock-only, no body, more idle connections", "POST", "/lock/nobody2", "", 3, false},
		{"lock-only, GET", "GET", "/lock/get", "", 2, false},
		{"lock-only, body key with an Idempotency-Key", "POST", "/lockjson/charge", `{"order_id":"o-1","amount":1299}`, 1, false},
		{"idempotency, header key, JSON body", "POST", "/idem/body", `{"amount":1299}`, 1, true},
		{"idempotency, header key, no body", "POST", "/idem/nobody", "", 1, true},
		{"idempotency, no body, more idle connections", "POST", "/idem/nobody2", "", 3, true},
		{"lb_retry_match on POST", "POST", "/retries/charge", `{"amount":1299}`, 2, false},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			prefix := c.path[:strings.LastIndex(c.path, "/")]
			// Requests before the charge leave the route's upstream
			// connections idle, to be reused by the charge and by any
			// second sending of it.
			var wg sync.WaitGroup
			for j := range c.idle {
				wg.Add(1)
				go func() {
					defer wg.Done()
					warmBody := strings.Replace(c.body, "o-1", fmt.Sprintf("warm-%d-%d", i, j), 1)
					r, err := s.send(context.Background(), c.method, prefix+"/warm", warmBody, "Idempotency-Key", fmt.Sprintf("warm-%d-%d", i, j))
					if err != nil || r.Status != 200 {
						t.Errorf("warm-up: %v %v", r, err)
					}
				}()
			}
			wg.Wait()
			key := fmt.Sprintf("charge-%d", i)
			r := s.do(c.method, c.path, c.body, "Idempotency-Key", key)
			if n := be.executions(c.path); n != 1 {
				t.Fatalf("the backend ran the charge %d times, want 1 (client got %s)", n, r)
			}
			if r.Status != http.StatusBadGateway {
				t.Fatalf("client got %s, want 502: the outcome is unknown", r)
			}
			// A body the handler did not read has no GetBody: the
			// transport does not try again. Every other case was stopped
			// from a second sending. Either way the outcome is unknown.
			p := expectProblem(t, r, http.StatusBadGateway)
			if !strings.HasSuffix(p.Type, "#outcome-unknown") {
				t.Fatalf("problem type %q, want outcome-unknown", p.Type)
			}
			if !c.idempotency {
				return
			}
			// The retry gets the stored outcome, and the backend is not
			// reached again.
			retry := s.do(c.method, c.path, c.body, "Idempotency-Key", key)
			if retry.Status != http.StatusBadGateway || retry.Header.Get("Idempotent-Replayed") != "true" || retry.Body != r.Body {
				t.Fatalf("retry got %s, want the stored 502 replayed", retry)
			}
			if n := be.executions(c.path); n != 1 {
				t.Fatalf("after the retry the backend ran the charge %d times, want 1", n)
			}
		})
	}

	// A request that never reached an upstream (refused dial) is still
	// tried on the next one, and runs once.
	t.Run("lb_retries after a refused dial", func(t *testing.T) {
		r := s.do("POST", "/dead/charge", `{"amount":1299}`, "Idempotency-Key", "dial-1")
		if r.Status != http.StatusCreated {
			t.Fatalf("client got %s, want 201 from the second upstream", r)
		}
		var doc map[string]any
		if err := json.Unmarshal([]byte(r.Body), &doc); err != nil || doc["object"] != "charge" {
			t.Fatalf("body %q is not the charge", r.Body)
		}
		if n := be.executions("/dead/charge"); n != 1 {
			t.Fatalf("the backend ran the charge %d times, want 1", n)
		}
	})
}
