package redislock

// The test backends behind the sites of the tests through Caddy: the
// recorder (every request it gets, overlaps, and the one count of
// executions), a gate that holds requests until opened, a charging backend
// that numbers its charges, and the parsing of the fencing tokens they see.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// seen is one request as the backend saw it.
type seen struct {
	Path    string
	Key     string   // Idempotency-Key header, or X-Test-Key
	Fencing []string // Fencing-Token values
	Header  http.Header
	Trailer http.Header // after the body was read
	Body    []byte
	At      time.Time
	Ctx     context.Context
}

// recorder is a test backend that records every request and flags
// overlapping executions for the same key.
type recorder struct {
	*httptest.Server
	mu       sync.Mutex
	reqs     []seen
	inflight map[string]int
	overlaps int
	entered  chan seen
	handle   func(w http.ResponseWriter, r *http.Request, s seen) // nil: 200 "ok"
}

func newRecorder(t testing.TB, handle func(w http.ResponseWriter, r *http.Request, s seen)) *recorder {
	t.Helper()
	rec := &recorder{inflight: map[string]int{}, entered: make(chan seen, 1024), handle: handle}
	rec.Server = httptest.NewServer(http.HandlerFunc(rec.serve))
	t.Cleanup(rec.Close)
	return rec
}

func (rec *recorder) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	key := r.Header.Get("Idempotency-Key")
	if key == "" {
		key = r.Header.Get("X-Test-Key")
	}
	s := seen{Path: r.URL.Path, Key: key, Fencing: r.Header.Values("Fencing-Token"),
		Header: r.Header.Clone(), Trailer: r.Trailer.Clone(), Body: body, At: time.Now(), Ctx: r.Context()}
	rec.mu.Lock()
	rec.reqs = append(rec.reqs, s)
	rec.inflight[key]++
	if rec.inflight[key] > 1 {
		rec.overlaps++
	}
	rec.mu.Unlock()
	defer func() {
		rec.mu.Lock()
		rec.inflight[key]--
		rec.mu.Unlock()
	}()
	select {
	case rec.entered <- s:
	default:
	}
	if rec.handle != nil {
		rec.handle(w, r, s)
		return
	}
	w.Header().Set("Fencing-Seen", strings.Join(s.Fencing, ","))
	io.WriteString(w, "ok")
}

func (rec *recorder) requests() []seen {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]seen(nil), rec.reqs...)
}

// executions counts the requests that reached the backend carrying one of
// keys (Idempotency-Key, or X-Test-Key), or all of them without keys.
func (rec *recorder) executions(keys ...string) int {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(keys) == 0 {
		return len(rec.reqs)
	}
	n := 0
	for _, s := range rec.reqs {
		if slices.Contains(keys, s.Key) {
			n++
		}
	}
	return n
}

// waitEntered waits for the next request to reach the backend.
func (rec *recorder) waitEntered(t *testing.T, d time.Duration) seen {
	t.Helper()
	select {
	case s := <-rec.entered:
		return s
	case <-time.After(d):
		t.Fatalf("no request reached the backend within %v", d)
		return seen{}
	}
}

// hostPort is the backend's address for reverse_proxy.
func (rec *recorder) hostPort() string { return strings.TrimPrefix(rec.URL, "http://") }

// gate is a backend behaviour that blocks the first n requests until opened
// (or until their context ends), so that a test controls how long a lock is
// held.
type gate struct {
	once sync.Once
	ch   chan struct{}
}

func newGate() *gate { return &gate{ch: make(chan struct{})} }

func (g *gate) open() { g.once.Do(func() { close(g.ch) }) }

// chargeBackend answers by path, and numbers its charges so that a replay
// (the same number) tells itself from a second execution.
func chargeBackend(t *testing.T) *recorder {
	t.Helper()
	var charges atomic.Int64
	be := newRecorder(t, func(w http.ResponseWriter, r *http.Request, s seen) {
		n := charges.Add(1)
		switch {
		case strings.HasPrefix(s.Path, "/pay/status/"):
			code, _ := strconv.Atoi(strings.TrimPrefix(s.Path, "/pay/status/"))
			w.Header().Set("X-Charge", strconv.FormatInt(n, 10))
			w.WriteHeader(code)
			fmt.Fprintf(w, `{"status":%d,"charge":%d}`, code, n)
		case s.Path == "/pay/slow":
			select {
			case <-time.After(800 * time.Millisecond):
			case <-r.Context().Done():
				return
			}
			fmt.Fprintf(w, `{"charge":%d}`, n)
		case s.Path == "/pay/hang":
			<-r.Context().Done()
		case s.Path == "/pay/reset":
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
		case s.Path == "/pay/big":
			io.WriteString(w, strings.Repeat("x", 5000))
		case s.Path == "/pay/br": // a coding a replay could not decode
			w.Header().Set("Content-Encoding", "br")
			io.WriteString(w, "\x0b\x02\x80charge\x03")
		case s.Path == "/pay/sse":
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "data: charge %d\n\n", n)
		case s.Path == "/pay/text":
			w.Header().Set("Content-Type", "text/plain")
			io.WriteString(w, strings.Repeat(fmt.Sprintf("charge %d ", n), 200))
		default:
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("X-Charge", strconv.FormatInt(n, 10))
			w.Header().Set("Set-Cookie", "session=secret-of-the-first-client")
			w.Header().Set("Keep-Alive", "timeout=5")
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"charge":%d,"fencing":%q}`, n, strings.Join(s.Fencing, ","))
		}
	})
	return be
}

// fence parses a single fencing token.
func fence(t *testing.T, vals []string) int64 {
	t.Helper()
	if len(vals) != 1 {
		t.Fatalf("Fencing-Token values = %q, want exactly one", vals)
	}
	n, err := strconv.ParseInt(vals[0], 10, 64)
	if err != nil || n <= 0 {
		t.Fatalf("Fencing-Token = %q, want a positive integer", vals[0])
	}
	return n
}

// parseFence is fence for backend handlers, which must not call t.Fatal:
// 0 when vals is not exactly one positive integer.
func parseFence(vals []string) int64 {
	if len(vals) != 1 {
		return 0
	}
	n, _ := strconv.ParseInt(vals[0], 10, 64)
	return n
}
