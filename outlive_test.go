package redislock

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

// An answer the backend streams after the client has gone is still stored
// whole, and the retry gets it byte for byte. The body (1 MiB) is well
// above what the writers between Caddy and the client buffer (256 KiB),
// and it is written in flushed chunks once the client's connection is
// closed, so that writes to the client really fail: the recording must
// go on past the first failed write. The backend runs once.
func TestIdempotencyRecordsPastFailedClientWrites(t *testing.T) {
	t.Parallel()
	const size, chunk = 1 << 20, 16 << 10
	var want bytes.Buffer
	for i := 0; want.Len() < size; i++ {
		fmt.Fprintf(&want, "%07d\n", i) // every line its own: a dropped or repeated chunk shows
	}
	srv, _ := newRedis(t)
	gone := make(chan struct{})
	be := newRecorder(t, func(w http.ResponseWriter, r *http.Request, s seen) {
		select {
		case <-gone:
		case <-time.After(10 * time.Second):
			return // the test has failed already
		}
		rc := http.NewResponseController(w)
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(http.StatusCreated)
		body := want.Bytes()
		for off := 0; off < len(body); off += chunk {
			if _, err := w.Write(body[off:min(off+chunk, len(body))]); err != nil {
				return
			}
			if err := rc.Flush(); err != nil {
				return
			}
			time.Sleep(time.Millisecond) // Caddy's writes to the closed connection fail meanwhile
		}
	})
	s := startCaddySite(t, paySite(srv.Addr, be.hostPort(), idempotent("max_response 2MiB")), siteOptions{})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sent := make(chan error, 1)
	go func() {
		_, err := s.send(ctx, "POST", "/pay/stream", `{}`, "Idempotency-Key", "left-early")
		sent <- err
	}()
	be.waitEntered(t, 5*time.Second)
	cancel() // the client leaves before the backend has written anything
	select {
	case err := <-sent:
		if err == nil {
			t.Fatal("the client got an answer before the backend wrote one")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the cancelled request did not return")
	}
	// Caddy sees the connection closed (its read ends) before the first
	// byte, so that every write of the answer goes to a closed connection.
	time.Sleep(100 * time.Millisecond)
	close(gone)

	var r *response
	redistest.Eventually(t, 15*time.Second, "the stored answer", func() bool {
		r = s.do("POST", "/pay/stream", `{}`, "Idempotency-Key", "left-early")
		return r.Status != http.StatusConflict
	})
	if r.Status != http.StatusCreated || r.Header.Get(replayedHeader) != "true" {
		t.Fatalf("retry after the client left: %d, %s %q; want the stored 201 replayed",
			r.Status, replayedHeader, r.Header.Get(replayedHeader))
	}
	if r.Body != want.String() {
		n := 0
		for n < min(len(r.Body), want.Len()) && r.Body[n] == want.Bytes()[n] {
			n++
		}
		t.Fatalf("the replayed body: %d bytes, want %d; they differ from byte %d", len(r.Body), want.Len(), n)
	}
	if n := be.executions("left-early"); n != 1 {
		t.Fatalf("backend ran %d times, want once", n)
	}
}
