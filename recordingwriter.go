package redislock

import (
	"bytes"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/reqlock/caddy-redis-lock/record"
)

// recordingWriter passes a response through to the client and keeps a copy for the
// idempotency record: the status, the headers the next handler set, and the
// body up to a maximum. When the client goes away it goes on taking the
// body (and telling the writer it was written), so that reverse_proxy reads
// the backend's whole answer and it is stored for the client's retry.
type recordingWriter struct {
	caddyhttp.ResponseWriterWrapper
	max        int64
	head       bool        // the request is HEAD: no body to keep
	before     http.Header // the headers set before the next handler ran
	status     int
	header     http.Header // the next handler's headers, when the status was written
	body       bytes.Buffer
	overflow   bool // the body went past max and is not kept
	clientGone bool // a write to the client failed
	cookies    bool // Set-Cookie is stored (replay_cookies)
}

func newRecordingWriter(w http.ResponseWriter, max int64, head, cookies bool) *recordingWriter {
	return &recordingWriter{ResponseWriterWrapper: caddyhttp.ResponseWriterWrapper{ResponseWriter: w},
		max: max, head: head, cookies: cookies, before: w.Header().Clone()}
}

// WriteHeader records a final status and the headers set with it;
// informational ones (1xx but 101) pass.
func (w *recordingWriter) WriteHeader(status int) {
	if w.status == 0 && (status >= 200 || status == http.StatusSwitchingProtocols) {
		w.status = status
		w.header = storedHeader(w.before, w.Header(), w.cookies)
	}
	w.ResponseWriter.WriteHeader(status)
}

// Write keeps p while the body fits max, and passes it to the client unless
// the client is gone; it always reports p written.
func (w *recordingWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if !w.overflow {
		if int64(w.body.Len()+len(p)) > w.max {
			w.overflow = true
			w.body = bytes.Buffer{}
		} else {
			w.body.Write(p)
		}
	}
	if !w.clientGone {
		if _, err := w.ResponseWriter.Write(p); err != nil {
			w.clientGone = true
		}
	}
	return len(p), nil
}

// ReadFrom copies through Write, so the wrapped writer's own ReadFrom (which
// would bypass the copy) is never used.
func (w *recordingWriter) ReadFrom(r io.Reader) (int64, error) {
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	return io.CopyBuffer(writerOnly{w}, r, *bp)
}

// FlushError flushes to the client; a failure means the client is gone,
// which does not stop the recording.
func (w *recordingWriter) FlushError() error {
	if !w.clientGone {
		if err := http.NewResponseController(w.ResponseWriter).Flush(); err != nil {
			w.clientGone = true
		}
	}
	return nil
}

// Flush is FlushError for callers that use http.Flusher.
func (w *recordingWriter) Flush() { _ = w.FlushError() }

// response is the record of the finished response. A body too large to
// keep, a stream or an upgrade, and the answer to HEAD are kept without
// their body and cannot be replayed.
func (w *recordingWriter) response() *record.Response {
	status, header := w.status, w.header
	if status == 0 { // the next handler wrote nothing: net/http sends 200
		status, header = http.StatusOK, storedHeader(w.before, w.Header(), w.cookies)
	}
	r := &record.Response{Outcome: record.Replayable, Status: status, Header: header, Body: w.body.Bytes()}
	streamed := status == http.StatusSwitchingProtocols ||
		strings.HasPrefix(strings.ToLower(header.Get("Content-Type")), "text/event-stream")
	// A body in a coding a replay could not decode for another client.
	undecodable := !slices.Contains(decodableEncodings, strings.ToLower(header.Get("Content-Encoding"))) &&
		header.Get("Content-Encoding") != ""
	if w.head || w.overflow || streamed || undecodable {
		r.Outcome, r.Body = record.NotReplayable, nil
	}
	return r
}

// notStored are response headers a replay must not repeat: hop-by-hop ones
// (RFC 9110 7.6.1) and cookies (a session is the client's, not the key's;
// replay_cookies keeps them where a scope ties the key to one client), and
// the length and date, which the replay sets anew.
var notStored = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
	"Set-Cookie", "Content-Length", "Date"}

// storedHeader is what the next handler set in h (the headers that differ
// from before), without the headers a replay must not repeat; with
// Set-Cookie when cookies is true.
func storedHeader(before, h http.Header, cookies bool) http.Header {
	out := make(http.Header, len(h))
	for k, v := range h {
		if !slices.Equal(before[k], v) && (!slices.Contains(notStored, k) || cookies && k == "Set-Cookie") {
			out[k] = slices.Clone(v)
		}
	}
	for _, c := range h.Values("Connection") {
		for name := range strings.SplitSeq(c, ",") {
			delete(out, http.CanonicalHeaderKey(strings.TrimSpace(name)))
		}
	}
	maps.DeleteFunc(out, func(k string, _ []string) bool { return strings.HasPrefix(k, http.TrailerPrefix) })
	return out
}

var (
	_ http.Flusher  = (*recordingWriter)(nil)
	_ io.ReaderFrom = (*recordingWriter)(nil)
)
