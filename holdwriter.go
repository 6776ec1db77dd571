package redislock

import (
	"io"
	"net/http"
	"sync"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// holdWriter passes the response through but holds back its end, so that
// the lock can be released before the client has the complete response: a
// client that has its answer can retry at once without meeting its own lock.
// It holds the latest write whole when that fits in holdSize bytes (a small
// response then still reaches the client in one write, as without the lock),
// otherwise its last byte.
type holdWriter struct {
	caddyhttp.ResponseWriterWrapper                // by value: one object per request, not two
	held                            [holdSize]byte // an array, so holding allocates nothing
	n                               int            // bytes held
	started                         bool           // status line or body bytes passed to the client side
}

// holdSize covers a typical JSON API answer.
const holdSize = 1024

// holdWriters recycles holdWriters, so the 1 KiB array is not allocated and
// zeroed for every request.
var holdWriters = sync.Pool{New: func() any { return new(holdWriter) }}

func newHoldWriter(w http.ResponseWriter) *holdWriter {
	hw := holdWriters.Get().(*holdWriter)
	hw.ResponseWriter = w
	return hw
}

// free returns w to the pool once the response is done with it, as net/http
// allows: no handler may use a ResponseWriter after its ServeHTTP returned.
// Not called when the request panics (the writer is then left to the GC),
// and called last, after anything that could panic and reach the handler's
// recover, which still uses the writer.
func (w *holdWriter) free() {
	w.ResponseWriter, w.n, w.started = nil, 0, false
	holdWriters.Put(w)
}

// WriteHeader passes the status on; informational (1xx) ones do not start
// the response.
func (w *holdWriter) WriteHeader(status int) {
	if status >= 200 || status == http.StatusSwitchingProtocols {
		w.started = true
	}
	w.ResponseWriter.WriteHeader(status)
}

// Write writes what was held before and holds p, or its last byte.
func (w *holdWriter) Write(p []byte) (int, error) {
	w.started = true
	if len(p) == 0 {
		return w.ResponseWriter.Write(p)
	}
	if err := w.writeHeld(); err != nil {
		return 0, err
	}
	if len(p) <= holdSize {
		w.n = copy(w.held[:], p)
		return len(p), nil
	}
	if n, err := w.ResponseWriter.Write(p[:len(p)-1]); err != nil {
		return n, err
	}
	w.held[0], w.n = p[len(p)-1], 1
	return len(p), nil
}

// writeHeld writes the held bytes, if any.
func (w *holdWriter) writeHeld() error {
	if w.n == 0 {
		return nil
	}
	n := w.n
	w.n = 0
	_, err := w.ResponseWriter.Write(w.held[:n])
	return err
}

// ReadFrom copies through Write, so the wrapped writer's own ReadFrom (which
// would bypass the held bytes) is never used.
func (w *holdWriter) ReadFrom(r io.Reader) (int64, error) {
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	return io.CopyBuffer(writerOnly{w}, r, *bp)
}

// FlushError writes the held bytes and flushes: a streaming handler wants
// everything written so far at the client.
func (w *holdWriter) FlushError() error {
	w.started = true
	if err := w.writeHeld(); err != nil {
		return err
	}
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Flush is FlushError for callers that use http.Flusher.
func (w *holdWriter) Flush() { _ = w.FlushError() }

// finish writes the held bytes: called once the lock is released.
func (w *holdWriter) finish() error { return w.writeHeld() }

// discard drops the held bytes, so an aborted response stays incomplete.
func (w *holdWriter) discard() { w.n = 0 }

// writerOnly hides holdWriter's ReadFrom from io.CopyBuffer.
type writerOnly struct{ io.Writer }

var copyBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

var (
	_ http.Flusher  = (*holdWriter)(nil)
	_ io.ReaderFrom = (*holdWriter)(nil)
)
