package redistest

import (
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy is a TCP proxy on a free loopback port in front of a server, for
// the network faults a real link produces and a stopped or paused server
// does not: a stalled connection that delivers what it held late (Hold),
// while the client's other connections work, and a slow link (Throttle).
type Proxy struct {
	Addr string

	target string
	l      net.Listener
	mu     sync.Mutex
	conns  map[*proxyConn]struct{}
	rate   int // bytes a second each way on each connection; 0: no limit
	hold   hold
	closed bool
	wg     sync.WaitGroup
}

// hold is a stall of the link: what clients write from from to end waits
// until until.
type hold struct{ from, end, until time.Time }

// proxyConn is one client connection and its server side.
type proxyConn struct {
	client, server net.Conn
	stalled        time.Time // client-to-server bytes wait until then
}

// StartProxy starts a Proxy to target, closed when tb ends.
func StartProxy(tb testing.TB, target string) *Proxy {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &Proxy{Addr: l.Addr().String(), target: target, l: l, conns: map[*proxyConn]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	tb.Cleanup(p.Close)
	return p
}

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		pc := &proxyConn{client: c, server: s}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			s.Close()
			return
		}
		p.conns[pc] = struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pump(pc, true)
		go p.pump(pc, false)
	}
}

// pump copies one direction of pc until either side closes: client to
// server when up, with the hold applied, else server to client.
func (p *Proxy) pump(pc *proxyConn, up bool) {
	defer p.wg.Done()
	defer func() {
		pc.client.Close()
		pc.server.Close()
		p.mu.Lock()
		delete(p.conns, pc)
		p.mu.Unlock()
	}()
	src, dst := pc.server, pc.client
	if up {
		src, dst = pc.client, pc.server
	}
	buf := make([]byte, 4096)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if up {
				p.waitHold(pc)
			}
			if werr := p.write(dst, buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// waitHold delays bytes read from pc's client while the link is held, and
// every byte after them on pc: they reach the server in order, when the
// hold ends.
func (p *Proxy) waitHold(pc *proxyConn) {
	now := time.Now()
	p.mu.Lock()
	h := p.hold
	if !now.Before(h.from) && now.Before(h.end) {
		pc.stalled = h.until
	}
	until := pc.stalled
	p.mu.Unlock()
	if now.Before(until) {
		time.Sleep(until.Sub(now))
	}
}

// write writes b to dst at the proxy's rate, if it has one.
func (p *Proxy) write(dst net.Conn, b []byte) error {
	p.mu.Lock()
	rate := p.rate
	p.mu.Unlock()
	if rate <= 0 {
		_, err := dst.Write(b)
		return err
	}
	const chunk = 1024
	for len(b) > 0 {
		n := min(chunk, len(b))
		start := time.Now()
		if _, err := dst.Write(b[:n]); err != nil {
			return err
		}
		time.Sleep(time.Duration(n)*time.Second/time.Duration(rate) - time.Since(start))
		b = b[n:]
	}
	return nil
}

// Hold stalls the link: what clients write during the next window, on any
// connection, reaches the server only when deliverAfter has passed from
// now, in order with what follows it on its connection, as over a partial
// partition that heals (a client that closes such a connection does not
// take back what it wrote). Connections that write nothing during the
// window are not held: a client's calls on them go through.
func (p *Proxy) Hold(window, deliverAfter time.Duration) {
	now := time.Now()
	p.mu.Lock()
	p.hold = hold{from: now, end: now.Add(window), until: now.Add(deliverAfter)}
	p.mu.Unlock()
}

// Throttle limits each connection, each way, to bytesPerSecond (0: no
// limit), as a slow link does.
func (p *Proxy) Throttle(bytesPerSecond int) {
	p.mu.Lock()
	p.rate = bytesPerSecond
	p.mu.Unlock()
}

// Open is the number of connections open through the proxy.
func (p *Proxy) Open() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Close stops the proxy and closes its connections.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	conns := make([]*proxyConn, 0, len(p.conns))
	for pc := range p.conns {
		conns = append(conns, pc)
	}
	p.mu.Unlock()
	p.l.Close()
	for _, pc := range conns {
		pc.client.Close()
		pc.server.Close()
	}
	p.wg.Wait()
}
