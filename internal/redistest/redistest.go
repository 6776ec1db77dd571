// Package redistest starts real redis-server processes on free loopback ports
// for tests, demos and benchmarks, so that every Redis behaviour is exercised
// against the real server rather than a fake.
package redistest

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// RequireEnv names the environment variable that turns a missing redis-server
// into a test failure instead of a skip. `make test` and CI set it.
const RequireEnv = "REDISLOCK_REQUIRE_REDIS"

// Server is one redis-server process listening on 127.0.0.1.
type Server struct {
	Addr string
	Port int
	dir  string
	cmd  *exec.Cmd
	args []string
	// head goes before the common flags (Sentinel's config file and
	// --sentinel); portArgs replaces "--port N" (TLS listens on --tls-port).
	head     []string
	portArgs []string
	// pingTLS, when set, is how the readiness PING reaches a TLS-only server.
	pingTLS *tls.Config
}

// Available reports whether redis-server is on PATH.
func Available() bool {
	_, err := exec.LookPath("redis-server")
	return err == nil
}

// Require skips tb when redis-server is missing, or fails it when
// REDISLOCK_REQUIRE_REDIS=1 or CI=true, so that a CI run never passes by
// skipping everything. Start and the topology starters call it; call it
// yourself before sharing a topology launched once per package.
func Require(tb testing.TB) {
	tb.Helper()
	if !Available() {
		msg := "redis-server not found on PATH: install it (apt-get install -y redis-server) or run `make test`, which does"
		if os.Getenv(RequireEnv) == "1" || os.Getenv("CI") == "true" {
			tb.Fatal(msg)
		}
		tb.Skip(msg)
	}
}

// Start starts a redis-server for tb on a free port and stops it when the test
// ends. Without redis-server the test is skipped, or fails when
// REDISLOCK_REQUIRE_REDIS=1 or CI=true.
func Start(tb testing.TB, extraArgs ...string) *Server {
	tb.Helper()
	Require(tb)
	s, err := Launch(extraArgs...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Close)
	return s
}

// Launch starts a redis-server on a free port; the caller must Close it.
func Launch(extraArgs ...string) (*Server, error) {
	return launch(spec{args: extraArgs})
}

// spec says how to start one redis-server; Launch, the cluster, Sentinel and
// TLS starters share it so that port retries and cleanup live in one place.
type spec struct {
	args []string
	// pickPort returns a candidate port; nil means FreePort.
	pickPort func() (int, error)
	// head returns the arguments before the common flags; it may write files
	// into the server's directory (Sentinel needs a writable config file).
	head func(dir string, port int) ([]string, error)
	// portArgs returns the listening flags; nil means "--port N".
	portArgs func(port int) []string
	pingTLS  *tls.Config
}

func launch(sp spec) (*Server, error) {
	pick := sp.pickPort
	if pick == nil {
		pick = FreePort
	}
	var lastErr error
	for range 5 { // a free port can be taken between probe and bind: retry
		port, err := pick()
		if err != nil {
			return nil, err
		}
		dir, err := os.MkdirTemp("", "redistest-")
		if err != nil {
			return nil, err
		}
		s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), Port: port, dir: dir, args: sp.args, pingTLS: sp.pingTLS}
		if sp.head != nil {
			if s.head, err = sp.head(dir, port); err != nil {
				os.RemoveAll(dir)
				return nil, err
			}
		}
		if sp.portArgs != nil {
			s.portArgs = sp.portArgs(port)
		}
		if err := s.start(); err != nil {
			lastErr = err
			os.RemoveAll(dir)
			continue
		}
		return s, nil
	}
	return nil, fmt.Errorf("redistest: could not start redis-server: %w", lastErr)
}

func (s *Server) start() error {
	args := append([]string(nil), s.head...)
	if s.portArgs != nil {
		args = append(args, s.portArgs...)
	} else {
		args = append(args, "--port", strconv.Itoa(s.Port))
	}
	args = append(args,
		"--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir,
		"--daemonize", "no", "--loglevel", "warning",
	)
	args = append(args, s.args...)
	cmd := exec.Command("redis-server", args...)
	// The log goes to a file in the server's directory so that a failed start
	// can say why (a taken port, a bad flag).
	logPath := filepath.Join(s.dir, "redis.log")
	if log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600); err == nil {
		cmd.Stdout, cmd.Stderr = log, log
		defer log.Close() // the child has its own copy after Start
	}
	cmd.SysProcAttr = SysProcAttr()
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			return fmt.Errorf("redis-server exited at start: %v%s", err, logTail(logPath))
		default:
		}
		if pingTLS(s.Addr, s.pingTLS) == nil {
			s.cmd = cmd
			go func() { <-exited }() // keep reaping
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = cmd.Process.Kill()
	<-exited
	return errors.New("redis-server did not answer PING within 10s" + logTail(logPath))
}

// logTail returns the last lines of a server log, for error messages.
func logTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil || len(b) == 0 {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 5 {
		lines = lines[len(lines)-5:]
	}
	return ": " + strings.Join(lines, " | ")
}

// ping sends a raw PING so this package needs no Redis client.
func ping(addr string) error { return pingTLS(addr, nil) }

func pingTLS(addr string, conf *tls.Config) error {
	var c net.Conn
	var err error
	d := &net.Dialer{Timeout: 200 * time.Millisecond}
	if conf != nil {
		c, err = (&tls.Dialer{NetDialer: d, Config: conf}).Dial("tcp", addr)
	} else {
		c, err = d.Dial("tcp", addr)
	}
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("unexpected reply %q", line)
	}
	return nil
}

// Pause stops the server with SIGSTOP: connections stay open, nothing answers,
// as with a hung or partitioned Redis.
func (s *Server) Pause() error { return s.signal(syscall.SIGSTOP) }

// Resume continues a paused server with SIGCONT.
func (s *Server) Resume() error { return s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) error {
	if s.cmd == nil {
		return errors.New("redistest: server not running")
	}
	return s.cmd.Process.Signal(sig)
}

// PID is the server's process id, 0 when it is not running: benchmarks read
// its CPU time from /proc.
func (s *Server) PID() int {
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Running reports whether the process is up (started and not stopped); a
// paused server counts as running.
func (s *Server) Running() bool { return s.cmd != nil }

// Stop kills the server; Restart brings it back on the same port, empty.
func (s *Server) Stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGCONT)
	_ = s.cmd.Process.Kill()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) && pingTLS(s.Addr, s.pingTLS) == nil {
		time.Sleep(10 * time.Millisecond)
	}
	s.cmd = nil
}

// Restart starts a stopped server again on the same address, with the same
// flags and directory (a cluster node finds its nodes.conf again).
func (s *Server) Restart() error {
	if s.cmd != nil {
		return errors.New("redistest: server still running")
	}
	var err error
	for range 50 { // the port may linger briefly after the kill
		if err = s.start(); err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
}

// Close stops the server and removes its directory.
func (s *Server) Close() {
	s.Stop()
	os.RemoveAll(s.dir)
}

// FreePort asks the kernel for a free loopback TCP port.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Context returns a context bounded to d, cancelled when tb ends.
func Context(tb testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	tb.Cleanup(cancel)
	return ctx
}
