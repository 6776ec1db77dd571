package redislock

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"os"
	"testing"
)

// A second attempt of a request already written upstream, stopped by
// sendOnce after it took a connection (the transport's retry on another
// kept-alive connection), cannot write on that connection: from its first
// header on, the connection's writes fail, and the backend reads nothing
// of it. This is what keeps a locked request sent upstream at most once
// when the transport re-sends it on its own.
func TestStoppedAttemptOnHeldConnectionCannotWrite(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	req, once := sendOnce(httptest.NewRequest(http.MethodPost, "http://backend/pay", nil), ctx, cancel)
	trace := httptrace.ContextClientTrace(req.Context())

	// The first attempt writes the request on a kept-alive connection,
	// which then breaks before the answer.
	first, firstFar := net.Pipe()
	defer first.Close()
	defer firstFar.Close()
	trace.GetConn("backend:80")
	trace.GotConn(httptrace.GotConnInfo{Conn: first, Reused: true})
	trace.WroteHeaderField("Host", []string{"backend"})
	trace.WroteHeaders()

	// The transport tries again, on another connection it already holds.
	trace.GetConn("backend:80")
	if !once.stopped() || !errors.Is(context.Cause(req.Context()), errSentOnce) {
		t.Fatalf("second attempt not stopped: stopped %v, cause %v", once.stopped(), context.Cause(req.Context()))
	}
	near, far := net.Pipe()
	defer far.Close()
	trace.GotConn(httptrace.GotConnInfo{Conn: near, Reused: true})
	trace.WroteHeaderField("Host", []string{"backend"})

	// The transport flushes the request line and headers it buffered.
	read := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(far)
		read <- b
	}()
	_, werr := near.Write([]byte("POST /pay HTTP/1.1\r\nHost: backend\r\nIdempotency-Key: k\r\n\r\n"))
	near.Close()
	got := <-read
	if !errors.Is(werr, os.ErrDeadlineExceeded) {
		t.Errorf("the stopped attempt's write: %v, want it to fail at once (%v)", werr, os.ErrDeadlineExceeded)
	}
	if len(got) != 0 {
		t.Errorf("the backend read %q of the stopped attempt, want nothing", got)
	}
}
