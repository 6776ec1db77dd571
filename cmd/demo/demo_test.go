package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestMain lets a test run the demo's main in a child process (exit status,
// Ctrl-C) without building a binary.
func TestMain(m *testing.M) {
	if os.Getenv("DEMO_TEST_RUN_MAIN") == "1" {
		os.Args = append([]string{"demo"}, strings.Fields(os.Getenv("DEMO_TEST_ARGS"))...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func smallOptions(embedded bool) options {
	return options{Orders: 6, Duplicates: 8, Delay: 250 * time.Millisecond,
		TTL: 10 * time.Second, Timeout: 20 * time.Second, Embedded: embedded}
}

func TestDemoEndToEnd(t *testing.T) {
	for _, tc := range []struct {
		name     string
		embedded bool
		kind     redisKind
	}{
		{"redis-server", false, redisProcess},
		{"embedded", true, redisEmbedded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !tc.embedded {
				requireRedisServer(t)
			}
			t.Setenv("REDIS_ADDR", "")
			opt := smallOptions(tc.embedded)
			var out bytes.Buffer
			o, err := runDemo(context.Background(), opt, &out)
			t.Logf("demo output:\n%s", out.String())
			if err != nil {
				t.Fatal(err)
			}
			checkOutcome(t, o, opt, out.String())
			if o.Redis != tc.kind {
				t.Errorf("redis %q, want %q", o.Redis, tc.kind)
			}
		})
	}
}

// checkOutcome asserts what the demo promises: no double charge behind
// redis_lock, every locked request answered 200 or 409, and report lines
// that match the ledger and the responses.
func checkOutcome(t *testing.T, o *outcome, opt options, out string) {
	t.Helper()
	n := opt.Orders * opt.Duplicates
	p, l := o.Plain, o.Locked
	if !o.ok() {
		t.Errorf("demo verdict is not ok")
	}
	if l.Ledger.DoubleCharges != 0 || l.Ledger.Charges != opt.Orders || l.Ledger.Orders != opt.Orders {
		t.Errorf("locked route ledger %+v: want exactly one charge for each of %d orders", l.Ledger, opt.Orders)
	}
	if l.Statuses[200]+l.Statuses[409] != n || l.Statuses[409] == 0 {
		t.Errorf("locked route statuses %v: want 200s and 409s only, %d in all", l.Statuses, n)
	}
	if l.Statuses[200] != l.Ledger.Charges {
		t.Errorf("locked route: %d x 200 but the ledger charged %d", l.Statuses[200], l.Ledger.Charges)
	}
	// The plain route's count is the ledger's, and the storm did cause some.
	want := 0
	for _, id := range p.Config.orderIDs() {
		if c := o.Ledger.Stats([]string{id}).Charges; c > 1 {
			want += c - 1
		}
	}
	if p.Ledger.DoubleCharges != want || want == 0 {
		t.Errorf("plain route: report says %d double charges, ledger per order says %d (want > 0)",
			p.Ledger.DoubleCharges, want)
	}
	if p.Statuses[200] != n || p.Ledger.Charges != n {
		t.Errorf("plain route: statuses %v, ledger %+v: want %d requests all reaching the backend", p.Statuses, p.Ledger, n)
	}
	wantLines := []string{
		fmt.Sprintf("plain reverse_proxy: %d requests, %d orders, %d double charges", n, opt.Orders, want),
		fmt.Sprintf("redis_lock:          %d requests, %d orders, 0 double charges, %d rejected with 409", n, opt.Orders, l.Statuses[409]),
	}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) < 2 || lines[len(lines)-2] != wantLines[0] || lines[len(lines)-1] != wantLines[1] {
		t.Errorf("report does not end with\n%s\n%s", wantLines[0], wantLines[1])
	}
}

// runMain starts the demo's main in a child process.
func runMain(t *testing.T, args string, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "DEMO_TEST_RUN_MAIN=1", "DEMO_TEST_ARGS="+args, "REDIS_ADDR=")
	cmd.Env = append(cmd.Env, env...)
	return cmd
}

func TestMainExitStatus(t *testing.T) {
	cmd := runMain(t, "-embedded -orders 3 -duplicates 4 -delay 150ms")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("demo exited with %v:\n%s", err, out)
	}
	if !regexp.MustCompile(`(?m)^redis_lock: +12 requests, 3 orders, 0 double charges, \d+ rejected with 409$`).Match(out) {
		t.Errorf("no redis_lock summary line in:\n%s", out)
	}
	if strings.Contains(string(out), "\r") {
		t.Errorf("progress redrawn with \\r although stdout is not a terminal")
	}

	bad := runMain(t, "-orders 0")
	if err := bad.Run(); err == nil {
		t.Error("-orders 0: exit status 0")
	}
}

// TestServeAndCtrlC runs `demo -serve`, tries the curl commands' requests
// by hand, then sends SIGINT and checks everything stopped.
func TestServeAndCtrlC(t *testing.T) {
	requireRedisServer(t)
	cmd := runMain(t, "-serve -orders 2 -duplicates 3 -delay 400ms")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill() //nolint:errcheck // already gone on success

	var out strings.Builder
	// A bufio.Reader, not a Scanner: what it has read ahead past the
	// "Ctrl-C" line is read from it below with the rest.
	br := bufio.NewReader(stdout)
	redisRe := regexp.MustCompile(`started on (127\.0\.0\.1:\d+)`)
	lockedRe := regexp.MustCompile(`redis_lock on http://(127\.0\.0\.1:\d+)`)
	backendRe := regexp.MustCompile(`ledger at http://(127\.0\.0\.1:\d+)/charge`)
	var redisAddr, locked, backend string
	for {
		line, err := br.ReadString('\n')
		out.WriteString(line)
		if err != nil {
			break
		}
		if m := redisRe.FindStringSubmatch(line); m != nil {
			redisAddr = m[1]
		}
		if m := lockedRe.FindStringSubmatch(line); m != nil {
			locked = m[1]
		}
		if m := backendRe.FindStringSubmatch(line); m != nil {
			backend = m[1]
		}
		if strings.Contains(line, "Ctrl-C") {
			break
		}
	}
	if redisAddr == "" || locked == "" || backend == "" {
		t.Fatalf("addresses not found in:\n%s\nstderr:\n%s", out.String(), stderr.String())
	}
	rest := make(chan string, 1) // the rest of the output; EOF when the demo exits
	go func() {
		b, _ := io.ReadAll(br)
		rest <- string(b)
	}()

	// A charge and its duplicate at once: one 200 with the fencing token the
	// backend saw, one 409 with Retry-After.
	type reply struct {
		code  int
		retry string
		body  map[string]any
	}
	charge := func(addr, order, fence string) reply {
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/charge",
			strings.NewReader(`{"order_id":"`+order+`","amount_cents":1299}`))
		req.Header.Set("Idempotency-Key", order)
		if fence != "" {
			req.Header.Set("Fencing-Token", fence)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			return reply{}
		}
		defer resp.Body.Close()
		var m map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&m)
		return reply{resp.StatusCode, resp.Header.Get("Retry-After"), m}
	}
	var wg sync.WaitGroup
	replies := make([]reply, 2)
	for i := range replies {
		wg.Go(func() { replies[i] = charge(locked, "by-hand-1", "") })
	}
	wg.Wait()
	if replies[0].code == 409 {
		replies[0], replies[1] = replies[1], replies[0]
	}
	if replies[0].code != 200 || replies[0].body["fencing_token"] == nil || replies[1].code != 409 || replies[1].retry == "" {
		t.Fatalf("charge + duplicate: %+v; want 200 with fencing_token, 409 with Retry-After", replies)
	}
	if r := charge(backend, "by-hand-1", "1"); r.code != http.StatusPreconditionFailed {
		t.Errorf("stale fencing token: %d, want 412", r.code)
	}

	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-rest:
		out.WriteString(r)
	case <-time.After(20 * time.Second):
		t.Fatal("demo did not stop within 20s of Ctrl-C")
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit after Ctrl-C: %v\n%s\nstderr:\n%s", err, out.String(), stderr.String())
	}
	if !strings.Contains(out.String(), "stopping") {
		t.Errorf("no shutdown message in:\n%s", out.String())
	}
	// redis-server runs in its own process group: only the demo can stop it.
	if c, err := net.DialTimeout("tcp", redisAddr, time.Second); err == nil {
		c.Close()
		t.Errorf("redis-server at %s still accepts connections after the demo stopped", redisAddr)
	}
}

func TestVerdict(t *testing.T) {
	locked := func(statuses map[int]int, doubles, errs int) outcome {
		return outcome{Locked: stormResult{
			Config:   stormConfig{Orders: 2, Duplicates: 3},
			Statuses: statuses, Errors: errs, Ledger: LedgerStats{DoubleCharges: doubles},
		}}
	}
	for _, tc := range []struct {
		name string
		o    outcome
		ok   bool
	}{
		{"one charge per order, 409s", locked(map[int]int{200: 2, 409: 4}, 0, 0), true},
		{"a double charge", locked(map[int]int{200: 3, 409: 3}, 1, 0), false},
		{"a 503", locked(map[int]int{200: 2, 409: 3, 503: 1}, 0, 0), false},
		{"a transport error", locked(map[int]int{200: 2, 409: 3}, 0, 1), false},
	} {
		if got := tc.o.ok(); got != tc.ok {
			t.Errorf("%s: ok() = %v, want %v", tc.name, got, tc.ok)
		}
	}
}
