package redistest

import (
	"io"
	"net"
	"sync"
	"testing"
)

// Hole is a TCP listener that accepts connections and never answers: a Redis
// behind a dead middlebox or a full accept queue looks like this to a client,
// unlike a stopped server whose port refuses at once. It reads and discards
// what is sent so that client writes do not block on a full window.
type Hole struct {
	Addr string

	l        net.Listener
	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	accepted int
	closed   bool
	wg       sync.WaitGroup
}

// BlackHole returns the address of a Hole closed when tb ends.
func BlackHole(tb testing.TB) string {
	tb.Helper()
	return StartBlackHole(tb).Addr
}

// StartBlackHole starts a Hole closed when tb ends; use it over BlackHole to
// count the connections a client opened.
func StartBlackHole(tb testing.TB) *Hole {
	tb.Helper()
	h, err := NewBlackHole()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(h.Close)
	return h
}

// NewBlackHole starts a Hole on a free loopback port; the caller must Close it.
func NewBlackHole() (*Hole, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	h := &Hole{Addr: l.Addr().String(), l: l, conns: map[net.Conn]struct{}{}}
	h.wg.Add(1)
	go h.serve()
	return h, nil
}

func (h *Hole) serve() {
	defer h.wg.Done()
	for {
		c, err := h.l.Accept()
		if err != nil {
			return
		}
		h.mu.Lock()
		if h.closed {
			h.mu.Unlock()
			c.Close()
			return
		}
		h.accepted++
		h.conns[c] = struct{}{}
		h.wg.Add(1)
		h.mu.Unlock()
		go func() {
			defer h.wg.Done()
			_, _ = io.Copy(io.Discard, c) // until the client or Close ends it
			h.mu.Lock()
			delete(h.conns, c)
			h.mu.Unlock()
			c.Close()
		}()
	}
}

// Accepted returns how many connections the Hole has accepted so far.
func (h *Hole) Accepted() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.accepted
}

// Open returns how many accepted connections the client has not closed yet,
// to check that a client gives up the connections it opened.
func (h *Hole) Open() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.conns)
}

// Close stops listening and drops every connection.
func (h *Hole) Close() {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	h.closed = true
	h.l.Close()
	for c := range h.conns {
		c.Close()
	}
	h.mu.Unlock()
	h.wg.Wait()
}
