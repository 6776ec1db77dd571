package redislock

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"time"
)

// errSentOnce ends an upstream request whose transport, or reverse_proxy,
// was about to send it a second time.
var errSentOnce = errors.New("redis_lock: the request was already sent upstream under this lock; not sending it again")

// sentOnce lets a locked request be written upstream at most once.
//
// Go's http.Transport re-sends a request by itself when a reused
// connection breaks after the request was written and before the first
// response byte, if the request counts as idempotent: GET and the like, or
// any method with an Idempotency-Key or X-Idempotency-Key header, whose
// body is absent or can be read again. reverse_proxy's own retries
// (lb_retries with lb_retry_match, or for GET) re-send it too. Either way
// the backend may run it twice, which is what the lock is there to stop.
//
// A client trace sees every attempt: an HTTP/1 attempt that wrote its
// headers marks the request sent, and any later attempt is stopped before
// a byte of it reaches the wire. Its context is cancelled (the transport
// checks it between attempts) and, should the attempt already hold a
// connection, that connection's writes are made to fail at once. Attempts
// that never wrote (a refused dial) go on as before. HTTP/2 is left alone:
// its transport only re-sends streams the server refused unprocessed.
type sentOnce struct {
	cancel context.CancelCauseFunc

	mu      sync.Mutex
	conn    net.Conn // the current attempt's connection
	attempt bool     // no header of the current attempt written yet
	http2   bool     // the current attempt is HTTP/2
	sent    bool     // an HTTP/1 attempt wrote its request
	halted  bool     // a later attempt was stopped
	wrote   bool     // an attempt, HTTP/1 or HTTP/2, wrote a header
}

// sendOnce returns r with a context that sends it upstream at most once:
// ctx, which cancel cancels, carrying the trace. The caller ends ctx.
func sendOnce(r *http.Request, ctx context.Context, cancel context.CancelCauseFunc) (*http.Request, *sentOnce) {
	s := &sentOnce{cancel: cancel}
	req := r.WithContext(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GetConn:          s.getConn,
		GotConn:          s.gotConn,
		WroteHeaderField: s.wroteHeaderField,
		WroteHeaders:     s.wroteHeaders,
	}))
	if getBody := r.GetBody; getBody != nil {
		// The transport rewinds the body before a second attempt: refusing
		// it there stops the attempt before it takes a connection.
		req.GetBody = func() (io.ReadCloser, error) {
			if s.isSent() {
				s.stop()
				return nil, errSentOnce
			}
			return getBody()
		}
	}
	return req, s
}

func (s *sentOnce) getConn(string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.conn, s.attempt, s.http2 = nil, true, false
	if s.sent {
		s.stopLocked()
	}
}

func (s *sentOnce) gotConn(info httptrace.GotConnInfo) {
	s.mu.Lock()
	s.conn = info.Conn
	s.mu.Unlock()
}

// wroteHeaderField sees an attempt's first header go into the
// connection's buffer: HTTP/2's first is a pseudo-header (":authority"),
// HTTP/1's is Host. A stopped HTTP/1 attempt's connection fails its writes
// from here on, so the buffered request line and headers never leave.
func (s *sentOnce) wroteHeaderField(key string, _ []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.attempt {
		return
	}
	s.attempt, s.wrote = false, true
	s.http2 = strings.HasPrefix(key, ":")
	if s.halted && !s.http2 && s.conn != nil {
		_ = s.conn.SetWriteDeadline(time.Unix(1, 0))
	}
}

// wroteHeaders marks the request sent once an HTTP/1 attempt has written
// its headers: whether or not they reached the backend is unknown from
// here, and a backend may act on headers alone.
func (s *sentOnce) wroteHeaders() {
	s.mu.Lock()
	if !s.http2 && !s.halted {
		s.sent = true
	}
	s.mu.Unlock()
}

func (s *sentOnce) isSent() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sent
}

func (s *sentOnce) stop() {
	s.mu.Lock()
	s.stopLocked()
	s.mu.Unlock()
}

func (s *sentOnce) stopLocked() {
	s.halted = true
	s.cancel(errSentOnce)
}

// stopped reports whether a second sending was stopped: the request was
// written once and its answer never came, an unknown outcome, whatever
// error the transport or reverse_proxy reports for it.
func (s *sentOnce) stopped() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.halted
}

// unsent reports whether the request is known never to have reached a
// backend: net/http's transport tried to send it and no attempt wrote a
// byte of it (a dial or a TLS handshake that never ended, say). Anything
// else, a transport that is not net/http's included, may have reached one.
func (s *sentOnce) unsent() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.attempt && !s.wrote // attempt: a connection asked for, no header written
}
