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
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/reqlock/caddy-redis-lock/internal/redistest"
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
	return options{Orders: 6, Duplicates: 8, Retries: 2, Delay: 250 * time.Millisecond,
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
				redistest.Require(t)
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

// checkOutcome asserts what the demo promises: behind redis_lock one
// charge per order in the storm and the rest 409, each late retry charged
// again; behind redis_lock + idempotency one charge per order in all, the
// storm's duplicates 409 and every late retry a replay; the plain route
// charging every request; and report lines that match the ledger and the
// responses.
func checkOutcome(t *testing.T, o *outcome, opt options, out string) {
	t.Helper()
	n := opt.Orders * opt.Duplicates
	late := opt.Orders * opt.Retries
	p, l, i := o.Plain, o.Locked, o.Idempotent
	if !o.ok() {
		t.Errorf("demo verdict is not ok")
	}
	for _, r := range []routeResult{p, l, i} {
		if r.Storm.Sent != n || r.Late.Sent != late || r.Storm.Errors+r.Late.Errors != 0 {
			t.Errorf("%s: sent %d + %d late, %d + %d transport errors; want %d + %d, no errors",
				r.Config.Name, r.Storm.Sent, r.Late.Sent, r.Storm.Errors, r.Late.Errors, n, late)
		}
	}

	// The plain route: every request reaches the backend and is charged.
	if p.Storm.Statuses[200] != n || p.Late.Statuses[200] != late || p.Replayed() != 0 {
		t.Errorf("plain route: storm %v, late %v, %d replayed; want every request 200, none replayed",
			p.Storm.Statuses, p.Late.Statuses, p.Replayed())
	}
	if want := (LedgerStats{Orders: opt.Orders, Charges: n + late, DoubleCharges: n + late - opt.Orders}); p.Ledger != want {
		t.Errorf("plain route ledger %+v, want %+v", p.Ledger, want)
	}
	// The report's count is the ledger's, order by order.
	perOrder := 0
	for _, id := range p.Config.orderIDs() {
		if c := o.Ledger.Stats([]string{id}).Charges; c > 1 {
			perOrder += c - 1
		}
	}
	if p.Ledger.DoubleCharges != perOrder {
		t.Errorf("plain route: report says %d double charges, ledger per order says %d", p.Ledger.DoubleCharges, perOrder)
	}

	// redis_lock alone: one charge per order in the storm, its duplicates
	// 409; every late retry is charged again.
	if l.Storm.Statuses[200] != opt.Orders || l.Storm.Statuses[409] != n-opt.Orders {
		t.Errorf("locked route storm %v: want 200 x%d, 409 x%d", l.Storm.Statuses, opt.Orders, n-opt.Orders)
	}
	if want := (LedgerStats{Orders: opt.Orders, Charges: opt.Orders}); l.StormLedger != want {
		t.Errorf("locked route ledger after the storm %+v, want %+v", l.StormLedger, want)
	}
	if l.Late.Statuses[200] != late || l.Replayed() != 0 {
		t.Errorf("locked route late retries %v, %d replayed: want 200 x%d, none replayed", l.Late.Statuses, l.Replayed(), late)
	}
	if want := (LedgerStats{Orders: opt.Orders, Charges: opt.Orders + late, DoubleCharges: late}); l.Ledger != want {
		t.Errorf("locked route ledger %+v, want %+v: each late retry charged again", l.Ledger, want)
	}

	// redis_lock + idempotency: the storm as behind the lock alone, then
	// every late retry a replay that never reaches the backend.
	if i.Storm.Statuses[200] != opt.Orders || i.Storm.Statuses[409] != n-opt.Orders || i.Storm.Replayed != 0 {
		t.Errorf("idempotency route storm %v, %d replayed: want 200 x%d, 409 x%d, none replayed",
			i.Storm.Statuses, i.Storm.Replayed, opt.Orders, n-opt.Orders)
	}
	if i.Late.Statuses[200] != late || i.Late.Replayed != late {
		t.Errorf("idempotency route late retries %v, %d replayed: want 200 x%d, all replayed", i.Late.Statuses, i.Late.Replayed, late)
	}
	if want := (LedgerStats{Orders: opt.Orders, Charges: opt.Orders}); i.StormLedger != want || i.Ledger != want {
		t.Errorf("idempotency route ledger %+v after the storm, %+v after the late retries; want %+v",
			i.StormLedger, i.Ledger, want)
	}

	wantLines := []string{
		fmt.Sprintf("plain reverse_proxy:       %d requests + %d late retries, %d orders, %d double charges",
			n, late, opt.Orders, n+late-opt.Orders),
		fmt.Sprintf("redis_lock:                %d requests + %d late retries, %d orders, %d double charges, %d rejected with 409",
			n, late, opt.Orders, late, n-opt.Orders),
		fmt.Sprintf("redis_lock + idempotency:  %d requests + %d late retries, %d orders, 0 double charges, %d rejected with 409, %d replayed",
			n, late, opt.Orders, n-opt.Orders, late),
	}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) < 3 || !slices.Equal(lines[len(lines)-3:], wantLines) {
		t.Errorf("report does not end with\n%s", strings.Join(wantLines, "\n"))
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
	cmd := runMain(t, "-embedded -orders 3 -duplicates 4 -retries 2 -delay 150ms")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("demo exited with %v:\n%s", err, out)
	}
	for _, re := range []string{
		`(?m)^redis_lock: +12 requests \+ 6 late retries, 3 orders, 6 double charges, 9 rejected with 409$`,
		`(?m)^redis_lock \+ idempotency: +12 requests \+ 6 late retries, 3 orders, 0 double charges, 9 rejected with 409, 6 replayed$`,
	} {
		if !regexp.MustCompile(re).Match(out) {
			t.Errorf("no line matching %s in:\n%s", re, out)
		}
	}
	if strings.Contains(string(out), "\r") {
		t.Errorf("progress redrawn with \\r although stdout is not a terminal")
	}

	for _, args := range []string{"-orders 0", "-retries -1"} {
		if err := runMain(t, args).Run(); err == nil {
			t.Errorf("%s: exit status 0", args)
		}
	}
}

// TestServeAndCtrlC runs `demo -serve`, tries the curl commands' requests
// by hand, then sends SIGINT and checks everything stopped.
func TestServeAndCtrlC(t *testing.T) {
	redistest.Require(t)
	cmd := runMain(t, "-serve -orders 2 -duplicates 3 -retries 1 -delay 400ms")
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
	idemRe := regexp.MustCompile(`redis_lock \+ idempotency on http://(127\.0\.0\.1:\d+)`)
	backendRe := regexp.MustCompile(`ledger at http://(127\.0\.0\.1:\d+)/charge`)
	adminRe := regexp.MustCompile(`^\s*admin (127\.0\.0\.1:\d+)$`)
	var redisAddr, locked, idem, backend, admin string
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
		if m := idemRe.FindStringSubmatch(line); m != nil {
			idem = m[1]
		}
		if m := backendRe.FindStringSubmatch(line); m != nil {
			backend = m[1]
		}
		if m := adminRe.FindStringSubmatch(strings.TrimRight(line, "\n")); m != nil {
			admin = m[1]
		}
		if strings.Contains(line, "Ctrl-C") {
			break
		}
	}
	if redisAddr == "" || locked == "" || idem == "" || backend == "" || admin == "" {
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
		code     int
		retry    string
		replayed string
		body     map[string]any
	}
	chargeAmount := func(addr, order, fence, amount string) reply {
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/charge",
			strings.NewReader(`{"order_id":"`+order+`","amount_cents":`+amount+`}`))
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
		return reply{resp.StatusCode, resp.Header.Get("Retry-After"), resp.Header.Get("Idempotent-Replayed"), m}
	}
	charge := func(addr, order, fence string) reply { return chargeAmount(addr, order, fence, "1299") }
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

	// A late retry: behind redis_lock alone it is charged again, behind
	// redis_lock + idempotency it gets the first answer back, replayed.
	if r := charge(locked, "by-hand-1", ""); r.code != 200 || r.body["charge"] != 2.0 || r.body["double_charge"] != true {
		t.Errorf("late retry through redis_lock: %+v; want 200, charged a second time", r)
	}
	first := charge(idem, "by-hand-2", "")
	again := charge(idem, "by-hand-2", "")
	if first.code != 200 || first.replayed != "" || first.body["charge"] != 1.0 {
		t.Errorf("charge through redis_lock + idempotency: %+v; want 200, charged once", first)
	}
	if again.code != 200 || again.replayed != "true" || !reflect.DeepEqual(again.body, first.body) {
		t.Errorf("late retry through redis_lock + idempotency: %+v; want the first answer %v, replayed", again, first.body)
	}
	if r := chargeAmount(idem, "by-hand-2", "", "999"); r.code != http.StatusUnprocessableEntity {
		t.Errorf("the key with another body: %d, want 422", r.code)
	}

	// The admin API: the key's record completed; removed, the next retry
	// is charged again.
	adminDo := func(method string) (int, map[string]any) {
		req, _ := http.NewRequest(method, "http://"+admin+"/redis_lock/keys?name=idempotent&key=by-hand-2", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			return 0, nil
		}
		defer resp.Body.Close()
		var m map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&m)
		return resp.StatusCode, m
	}
	if code, m := adminDo(http.MethodGet); code != 200 || fmt.Sprint(m["record"]) == "" || m["record"].(map[string]any)["state"] != "completed" {
		t.Errorf("admin lookup: %d %v; want the record completed", code, m)
	}
	if code, m := adminDo(http.MethodDelete); code != 200 || m["state"] != "completed" {
		t.Errorf("admin DELETE: %d %v", code, m)
	}
	if r := charge(idem, "by-hand-2", ""); r.code != 200 || r.replayed != "" || r.body["charge"] != 2.0 {
		t.Errorf("a retry after the DELETE: %+v; want it charged again", r)
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
	if c := strings.Count(out.String(), "curl -s -w '\\n' -X POST http://"+idem+"/charge"); c != 4 {
		t.Errorf("%d curl commands for the idempotency route, want a charge, its replay, a 422 and a retry after the DELETE:\n%s", c, out.String())
	}
	if c := strings.Count(out.String(), "http://"+admin+"/redis_lock/keys?name=idempotent&key=order-5"); c != 2 {
		t.Errorf("%d admin API curl commands, want a lookup and a DELETE:\n%s", c, out.String())
	}
	// redis-server runs in its own process group: only the demo can stop it.
	if c, err := net.DialTimeout("tcp", redisAddr, time.Second); err == nil {
		c.Close()
		t.Errorf("redis-server at %s still accepts connections after the demo stopped", redisAddr)
	}
}

func TestVerdict(t *testing.T) {
	// wave is a storm or a late wave with statuses, replays and errors.
	wave := func(statuses map[int]int, replayed, errs int) responses {
		sent := errs
		for _, n := range statuses {
			sent += n
		}
		return responses{Sent: sent, Statuses: statuses, Replayed: replayed, Errors: errs}
	}
	stormOK := wave(map[int]int{200: 2, 409: 4}, 0, 0)
	lockLate := wave(map[int]int{200: 2}, 0, 0)
	replays := wave(map[int]int{200: 2}, 2, 0)
	good := func() outcome {
		return outcome{
			Locked: routeResult{Storm: stormOK, Late: lockLate,
				StormLedger: LedgerStats{Orders: 2, Charges: 2},
				Ledger:      LedgerStats{Orders: 2, Charges: 4, DoubleCharges: 2}},
			Idempotent: routeResult{Storm: stormOK, Late: replays,
				StormLedger: LedgerStats{Orders: 2, Charges: 2},
				Ledger:      LedgerStats{Orders: 2, Charges: 2}},
		}
	}
	for _, tc := range []struct {
		name   string
		change func(*outcome)
		ok     bool
	}{
		{"lock charges late retries again, idempotency replays them", func(*outcome) {}, true},
		{"no late retries", func(o *outcome) {
			o.Locked.Late, o.Idempotent.Late = responses{}, responses{}
			o.Locked.Ledger = o.Locked.StormLedger
		}, true},
		{"lock: a double charge in the storm", func(o *outcome) {
			o.Locked.StormLedger.DoubleCharges = 1
			o.Locked.Storm = wave(map[int]int{200: 3, 409: 3}, 0, 0)
		}, false},
		{"lock: a 503 in the storm", func(o *outcome) { o.Locked.Storm = wave(map[int]int{200: 2, 409: 3, 503: 1}, 0, 0) }, false},
		{"lock: a transport error in the storm", func(o *outcome) { o.Locked.Storm = wave(map[int]int{200: 2, 409: 3}, 0, 1) }, false},
		{"lock: a 409 among the late retries", func(o *outcome) { o.Locked.Late = wave(map[int]int{200: 1, 409: 1}, 0, 0) }, true},
		{"idempotency: a late retry charged again", func(o *outcome) {
			o.Idempotent.Late = wave(map[int]int{200: 2}, 1, 0)
			o.Idempotent.Ledger.DoubleCharges = 1
		}, false},
		{"idempotency: a double charge in the storm", func(o *outcome) {
			o.Idempotent.Ledger.DoubleCharges = 1
		}, false},
		{"idempotency: a 409 among the late retries", func(o *outcome) { o.Idempotent.Late = wave(map[int]int{200: 1, 409: 1}, 1, 0) }, true},
		{"idempotency: a 422 among the late retries", func(o *outcome) { o.Idempotent.Late = wave(map[int]int{200: 1, 422: 1}, 1, 0) }, false},
		{"idempotency: a transport error among the late retries", func(o *outcome) { o.Idempotent.Late = wave(map[int]int{200: 1}, 1, 1) }, false},
		{"idempotency: a 503 in the storm", func(o *outcome) { o.Idempotent.Storm = wave(map[int]int{200: 2, 409: 3, 503: 1}, 0, 0) }, false},
	} {
		o := good()
		tc.change(&o)
		if got := o.ok(); got != tc.ok {
			t.Errorf("%s: ok() = %v, want %v", tc.name, got, tc.ok)
		}
	}
}
