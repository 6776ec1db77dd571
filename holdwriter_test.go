package redislock

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"
)

// probeWriter records what reaches the client side; onWrite runs before each
// body write. It has a ReadFrom that must never be used.
type probeWriter struct {
	hdr        http.Header
	status     int
	body       bytes.Buffer
	flushes    int
	readFroms  int
	onWrite    func(p []byte)
	bodyWrites int
}

func newProbeWriter() *probeWriter { return &probeWriter{hdr: http.Header{}} }

func (p *probeWriter) Header() http.Header { return p.hdr }
func (p *probeWriter) WriteHeader(s int) {
	if p.status == 0 {
		p.status = s
	}
}
func (p *probeWriter) Write(b []byte) (int, error) {
	if p.status == 0 {
		p.status = 200
	}
	if p.onWrite != nil && len(b) > 0 {
		p.onWrite(b)
	}
	p.bodyWrites++
	return p.body.Write(b)
}
func (p *probeWriter) Flush() { p.flushes++ }
func (p *probeWriter) ReadFrom(r io.Reader) (int64, error) {
	p.readFroms++
	return p.body.ReadFrom(r)
}

func TestHoldWriterHoldsTheEnd(t *testing.T) {
	pw := newProbeWriter()
	hw := newHoldWriter(pw)
	if hw.WriteHeader(http.StatusEarlyHints); hw.started {
		t.Error("a 1xx response must not count as started")
	}
	write := func(s, want string) {
		t.Helper()
		if n, err := hw.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("Write(%.10q) = %d, %v", s, n, err)
		}
		if got := pw.body.String(); got != want {
			t.Fatalf("after Write(%.10q) the client side has %.20q (%d bytes), want %.20q (%d bytes)", s, got, len(got), want, len(want))
		}
	}
	write("hello", "")  // a small write is held whole
	write("", "")       // an empty one passes and changes nothing
	write("!", "hello") // the next write lets the held one go
	big := strings.Repeat("x", holdSize+1)
	write(big, "hello!"+big[:holdSize]) // a large one: all but its last byte
	if pw.bodyWrites != 4 {
		t.Errorf("%d writes reached the client side, want 4", pw.bodyWrites)
	}
	if n, err := hw.ReadFrom(strings.NewReader("+rf")); n != 3 || err != nil {
		t.Fatalf("ReadFrom = %d, %v", n, err)
	}
	if pw.readFroms != 0 {
		t.Error("ReadFrom went around the held bytes to the wrapped writer")
	}
	if got := pw.body.String(); got != "hello!"+big {
		t.Fatalf("after ReadFrom: %.20q", got)
	}
	if err := hw.finish(); err != nil || pw.body.String() != "hello!"+big+"+rf" {
		t.Fatalf("after finish: %.20q, %v", pw.body.String(), err)
	}
	if err := hw.finish(); err != nil || pw.body.String() != "hello!"+big+"+rf" {
		t.Fatal("a second finish must write nothing")
	}
}

// A small response reaches the client side in one write, as it would
// without the lock.
func TestHoldWriterSmallResponseOneWrite(t *testing.T) {
	pw := newProbeWriter()
	hw := newHoldWriter(pw)
	hw.Write([]byte(`{"ok":true}`))
	if pw.bodyWrites != 0 {
		t.Fatalf("%d writes before finish, want the response held", pw.bodyWrites)
	}
	if err := hw.finish(); err != nil || pw.bodyWrites != 1 || pw.body.String() != `{"ok":true}` {
		t.Fatalf("after finish: %d writes of %q, %v", pw.bodyWrites, pw.body.String(), err)
	}
}

// A writer back from the pool holds nothing of the response before it.
func TestHoldWriterFreedStartsClean(t *testing.T) {
	for i := range 100 { // sync.Pool may drop some; one reuse is enough
		first := newProbeWriter()
		hw := newHoldWriter(first)
		hw.WriteHeader(201)
		hw.Write([]byte("left over"))
		hw.free()

		pw := newProbeWriter()
		hw = newHoldWriter(pw)
		if hw.started || hw.n != 0 || hw.ResponseWriter != http.ResponseWriter(pw) {
			t.Fatalf("round %d: recycled writer started=%v held=%d", i, hw.started, hw.n)
		}
		hw.Write([]byte("mine"))
		if err := hw.finish(); err != nil || pw.body.String() != "mine" || first.body.String() != "" {
			t.Fatalf("round %d: new response %q, old one %q, %v", i, pw.body.String(), first.body.String(), err)
		}
		hw.free()
	}
}

func TestHoldWriterFlushAndDiscard(t *testing.T) {
	pw := newProbeWriter()
	hw := newHoldWriter(pw)
	hw.Write([]byte("data: 1\n"))
	// reverse_proxy flushes through http.ResponseController: it must find
	// our Flush first, which writes the held byte.
	if err := http.NewResponseController(hw).Flush(); err != nil {
		t.Fatal(err)
	}
	if pw.body.String() != "data: 1\n" || pw.flushes != 1 {
		t.Fatalf("after Flush: %q, %d flushes", pw.body.String(), pw.flushes)
	}
	hw.Write([]byte("partial"))
	hw.discard()
	hw.finish()
	if pw.body.String() != "data: 1\n" {
		t.Fatalf("after discard: %q, want the held write dropped", pw.body.String())
	}
	if !hw.started {
		t.Error("writes must mark the response started")
	}
	// Unwrap stays available for http.ResponseController's other calls.
	if hw.Unwrap() != pw {
		t.Error("Unwrap lost the wrapped writer")
	}
}
