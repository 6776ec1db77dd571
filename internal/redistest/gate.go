package redistest

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// Gate is a TCP proxy in front of a server that a test shuts and opens: one
// client's way to Redis, cut while the others' stays. Shut, its port
// refuses connections, as a stopped server's does, and the connections
// through it are dropped; open, it forwards each connection to the target.
type Gate struct {
	Addr   string
	target string

	mu    sync.Mutex
	l     net.Listener // nil while shut
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// StartGate starts an open Gate to target on a free loopback port, closed
// when tb ends.
func StartGate(tb testing.TB, target string) *Gate {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	g := &Gate{Addr: l.Addr().String(), target: target, conns: map[net.Conn]struct{}{}}
	g.serve(l)
	tb.Cleanup(g.Close)
	return g
}

// Shut stops listening, so that connecting is refused, and drops every
// connection through the gate.
func (g *Gate) Shut() {
	g.mu.Lock()
	if g.l != nil {
		g.l.Close()
		g.l = nil
	}
	for c := range g.conns {
		c.Close()
	}
	g.mu.Unlock()
}

// Open listens again on the gate's address. A port is taken again at once
// on Linux (Go's listeners set SO_REUSEADDR); another process may still
// have taken it in between, hence the retries.
func (g *Gate) Open() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.l != nil {
		return nil
	}
	var err error
	for range 50 {
		var l net.Listener
		if l, err = net.Listen("tcp", g.Addr); err == nil {
			g.serveLocked(l)
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return err
}

// Close shuts the gate and waits for its goroutines.
func (g *Gate) Close() {
	g.Shut()
	g.wg.Wait()
}

func (g *Gate) serve(l net.Listener) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.serveLocked(l)
}

func (g *Gate) serveLocked(l net.Listener) {
	g.l = l
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			g.wg.Add(1)
			go func() {
				defer g.wg.Done()
				g.forward(l, c)
			}()
		}
	}()
}

// forward copies between c, accepted on l, and a new connection to the
// target, until either side ends or the gate is shut.
func (g *Gate) forward(l net.Listener, c net.Conn) {
	defer c.Close()
	up, err := net.DialTimeout("tcp", g.target, 2*time.Second)
	if err != nil {
		return // the client sees its connection closed, as by a dying server
	}
	defer up.Close()
	g.mu.Lock()
	if g.l != l { // shut since the accept
		g.mu.Unlock()
		return
	}
	g.conns[c], g.conns[up] = struct{}{}, struct{}{}
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		delete(g.conns, c)
		delete(g.conns, up)
		g.mu.Unlock()
	}()
	done := make(chan error, 2)
	go func() { _, err := io.Copy(up, c); done <- err }()
	go func() { _, err := io.Copy(c, up); done <- err }()
	<-done // either side ending ends both
	c.Close()
	up.Close()
	<-done
}
