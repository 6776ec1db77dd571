package redistest

import (
	"net"
	"testing"
	"time"
)

// answers reports whether the server replies to PING within d.
func answers(s *Server, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if ping(s.Addr) == nil {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

func TestStartPauseResumeStopRestart(t *testing.T) {
	s := Start(t)
	if !answers(s, time.Second) {
		t.Fatal("a started server does not answer PING")
	}
	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	// Paused: the port still accepts connections (the kernel does), but
	// nothing answers.
	c, err := net.DialTimeout("tcp", s.Addr, time.Second)
	if err != nil {
		t.Fatalf("a paused server refuses connections: %v", err)
	}
	c.Close()
	if ping(s.Addr) == nil {
		t.Fatal("a paused server answered PING")
	}
	if err := s.Resume(); err != nil {
		t.Fatal(err)
	}
	if !answers(s, 2*time.Second) {
		t.Fatal("a resumed server does not answer")
	}
	s.Stop()
	if _, err := net.DialTimeout("tcp", s.Addr, 200*time.Millisecond); err == nil {
		t.Fatal("a stopped server still accepts connections")
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if !answers(s, time.Second) {
		t.Fatal("a restarted server does not answer on its old address")
	}
}

func TestServersGetDistinctPorts(t *testing.T) {
	a, b := Start(t), Start(t)
	if a.Addr == b.Addr {
		t.Fatalf("two servers on one address %s", a.Addr)
	}
}
