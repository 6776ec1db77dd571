package redislock

// The end-to-end test: a real Caddy binary built with the plugin, two Caddy
// processes (two "nodes") in front of one backend, sharing one redis-server,
// and a storm of concurrent duplicate requests split across both.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

// caddyBinary is ./cmd/caddy (Caddy with this plugin), built once for the
// package's end-to-end tests; TestMain removes it.
var caddyBinary struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// buildCaddyBinary returns the path of the Caddy binary, building it on the
// first call.
func buildCaddyBinary(t *testing.T) string {
	t.Helper()
	b := &caddyBinary
	b.once.Do(func() {
		if b.dir, b.err = os.MkdirTemp("", "caddy-redis-lock-e2e-"); b.err != nil {
			return
		}
		goTool := os.Getenv("GO")
		if goTool == "" {
			goTool = "go"
		}
		b.path = filepath.Join(b.dir, "caddy")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		start := time.Now()
		out, err := exec.CommandContext(ctx, goTool, "build", "-o", b.path, "./cmd/caddy").CombinedOutput()
		if err != nil {
			b.err = fmt.Errorf("go build ./cmd/caddy: %v\n%s", err, out)
			return
		}
		t.Logf("built Caddy with the plugin in %v", time.Since(start).Round(time.Millisecond))
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// TestMain removes the Caddy binary the end-to-end tests built.
func TestMain(m *testing.M) {
	code := m.Run()
	if caddyBinary.dir != "" {
		os.RemoveAll(caddyBinary.dir)
	}
	os.Exit(code)
}

// caddyProcess is one running `caddy run`.
type caddyProcess struct {
	URL      string
	AdminURL string // empty when the admin endpoint is off
	cmd      *exec.Cmd
	output   *bytes.Buffer
	exited   chan struct{} // closed when the process has exited
}

// nodeOptions are a Caddy process's global options.
type nodeOptions struct {
	admin bool          // serve the admin API on a free port
	grace time.Duration // the servers' grace_period on a stop (0: Caddy's default)
}

// startCaddyProcess runs bin with a Caddyfile holding one site whose body is
// body, on a free port, admin off, and stops it when the test ends.
func startCaddyProcess(t *testing.T, bin, name, body string) *caddyProcess {
	t.Helper()
	return startCaddyNode(t, bin, name, body, nodeOptions{})
}

// startCaddyNode is startCaddyProcess with opt's global options.
func startCaddyNode(t *testing.T, bin, name, body string, opt nodeOptions) *caddyProcess {
	t.Helper()
	dir := t.TempDir()
	port := mustFreePort(t)
	admin, adminURL := "admin off", ""
	if opt.admin {
		adminAddr := fmt.Sprintf("127.0.0.1:%d", mustFreePort(t))
		admin, adminURL = "admin "+adminAddr, "http://"+adminAddr
	}
	grace := ""
	if opt.grace > 0 {
		grace = fmt.Sprintf("\tgrace_period %v\n", opt.grace)
	}
	cf := fmt.Sprintf(`{
	%s
	persist_config off
	auto_https off
	skip_install_trust
	storage file_system %s
%s	log {
		level WARN
	}
}

http://127.0.0.1:%d {
%s
}
`, admin, filepath.Join(dir, "data"), grace, port, body)
	path := writeFile(t, dir, "Caddyfile", cf)
	out := new(bytes.Buffer)
	cmd := exec.Command(bin, "run", "--config", path, "--adapter", "caddyfile")
	cmd.SysProcAttr = redistest.SysProcAttr()
	cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_CONFIG_HOME="+dir, "XDG_DATA_HOME="+dir)
	cmd.Stdout, cmd.Stderr = &lockedWriter{w: out}, nil
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	p := &caddyProcess{URL: fmt.Sprintf("http://127.0.0.1:%d", port), AdminURL: adminURL, cmd: cmd, output: out, exited: exited}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", name, p.logs())
		}
	})
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			break
		}
		select {
		case <-exited:
			t.Fatalf("%s exited at start:\n%s", name, p.logs())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not listen on %s within 30s:\n%s", name, addr, p.logs())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return p
}

// kill ends p at once with sig (SIGKILL: a node's death), and waits until
// it has exited.
func (p *caddyProcess) kill(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		t.Fatalf("caddy did not exit within 30s of %v", sig)
	}
}

// logs is what p has written so far.
func (p *caddyProcess) logs() string {
	lw := p.cmd.Stdout.(*lockedWriter)
	lw.mu.Lock()
	defer lw.mu.Unlock()
	return p.output.String()
}

// lockedWriter serialises a process's writes with the test's reads.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

func TestEndToEndTwoCaddiesOneRedis(t *testing.T) {
	t.Parallel()
	srv, rdb := newRedis(t)
	st := stormTwoNodes(t, "redis "+srv.Addr, 20, 16)
	if left := lockKeys(t, rdb, DefaultPrefix); len(left) != 0 {
		t.Errorf("%d lock keys left in Redis after every request ended: %v", len(left), left)
	}
	st.nextFencesIncrease(t)
}

// storm is two Caddy processes in front of one backend, after a storm of
// concurrent duplicates split across both.
type storm struct {
	nodes      []*caddyProcess
	client     *http.Client
	firstFence map[string]int64 // the fencing token of each key's execution
}

// stormTwoNodes starts two Caddy processes whose redis_lock has the redis
// subdirective redisLine, fires keys x perKey concurrent duplicates split
// across both, and checks exclusion: exactly one execution per key, never
// two at once, every other answer 409 with Retry-After.
func stormTwoNodes(t *testing.T, redisLine string, keys, perKey int) *storm {
	t.Helper()
	total := keys * perKey
	bin := buildCaddyBinary(t)

	// The backend holds every execution until all duplicates have been
	// answered, so that "exactly one execution per key" does not depend on
	// timing; it records executions per key, overlaps and fencing tokens.
	release := make(chan struct{})
	var releaseOnce sync.Once
	openRelease := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(openRelease)
	var mu sync.Mutex
	execs := map[string][]int64{}
	holding := true
	be := newRecorder(t, func(w http.ResponseWriter, r *http.Request, s seen) {
		f := parseFence(s.Fencing)
		mu.Lock()
		execs[s.Key] = append(execs[s.Key], f)
		hold := holding
		mu.Unlock()
		if hold {
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
		}
		w.Header().Set("X-Fence", strconv.FormatInt(f, 10))
		io.WriteString(w, "charged "+s.Key)
	})

	site := fmt.Sprintf(`	redis_lock /pay* {http.request.header.Idempotency-Key} {
		%s
		ttl 5s
	}
	reverse_proxy %s`, redisLine, be.hostPort())
	nodes := []*caddyProcess{
		startCaddyProcess(t, bin, "caddy-a", site),
		startCaddyProcess(t, bin, "caddy-b", site),
	}

	client := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: total}}
	t.Cleanup(client.CloseIdleConnections)
	type result struct {
		key  string
		resp *response
		err  error
	}
	results := make(chan result, total)
	var answered sync.WaitGroup
	answered.Add(total - keys)
	go func() { // release the holders once every duplicate has its answer
		done := make(chan struct{})
		go func() { answered.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(45 * time.Second):
			t.Errorf("duplicates not all answered within 45s while the holders were held")
		}
		openRelease()
	}()

	start := make(chan struct{})
	var wg sync.WaitGroup
	var nonHolders sync.Mutex
	counted := 0
	for i := range total {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("e2e-key-%02d", i%keys)
			node := nodes[i%2]
			<-start
			r, err := sendRequest(context.Background(), client, "POST", node.URL+"/pay", `{"amount":100}`, "Idempotency-Key", key)
			if err != nil || r.Status != 200 {
				nonHolders.Lock()
				if counted < total-keys {
					counted++
					answered.Done()
				}
				nonHolders.Unlock()
			}
			results <- result{key, r, err}
		}()
	}
	began := time.Now()
	close(start)
	wg.Wait()
	close(results)
	t.Logf("%d requests over %d keys through 2 Caddies answered in %v", total, keys, time.Since(began).Round(time.Millisecond))

	okPerKey := map[string]int{}
	conflicts, others := 0, 0
	for r := range results {
		switch {
		case r.err != nil:
			others++
			t.Errorf("key %s: %v", r.key, r.err)
		case r.resp.Status == 200:
			okPerKey[r.key]++
		case r.resp.Status == http.StatusConflict:
			conflicts++
			if n, err := strconv.Atoi(r.resp.Header.Get("Retry-After")); err != nil || n < 1 {
				t.Errorf("409 with Retry-After %q, want whole seconds >= 1", r.resp.Header.Get("Retry-After"))
			}
		default:
			others++
			if others <= 5 {
				t.Errorf("key %s: unexpected %s", r.key, r.resp)
			}
		}
	}
	if conflicts != total-keys || others != 0 {
		t.Errorf("%d conflicts and %d other answers; want %d conflicts and no other", conflicts, others, total-keys)
	}
	mu.Lock()
	holding = false
	st := &storm{nodes: nodes, client: client, firstFence: map[string]int64{}}
	for k := range keys {
		key := fmt.Sprintf("e2e-key-%02d", k)
		if n := len(execs[key]); n != 1 {
			t.Errorf("key %s: %d upstream executions, want exactly 1", key, n)
		}
		if okPerKey[key] != 1 {
			t.Errorf("key %s: %d answers 200, want 1", key, okPerKey[key])
		}
		if len(execs[key]) > 0 {
			st.firstFence[key] = execs[key][0]
		}
	}
	mu.Unlock()
	be.mu.Lock()
	overlaps := be.overlaps
	be.mu.Unlock()
	if overlaps != 0 {
		t.Errorf("%d overlapping executions of one key", overlaps)
	}
	return st
}

// nextFencesIncrease sends one more request per key, through the other
// node than before, and checks that its fencing token is higher.
func (st *storm) nextFencesIncrease(t *testing.T) (slowest time.Duration) {
	t.Helper()
	k := 0
	for key, first := range st.firstFence {
		k++
		sent := time.Now()
		r, err := sendRequest(context.Background(), st.client, "POST", st.nodes[k%2].URL+"/pay", `{"amount":100}`, "Idempotency-Key", key)
		slowest = max(slowest, time.Since(sent))
		if err != nil || r.Status != 200 {
			t.Fatalf("next request for %s: %v %v", key, err, r)
		}
		if f, _ := strconv.ParseInt(r.Header.Get("X-Fence"), 10, 64); f <= first {
			t.Errorf("key %s: next fencing token %d, want above %d", key, f, first)
		}
	}
	return slowest
}

// Idempotency across nodes: concurrent duplicates split over two Caddy
// processes run once per key, and every retry, landing on the other node,
// gets the stored answer; the same key with another body is 422 there too.
func TestEndToEndIdempotencyTwoNodes(t *testing.T) {
	t.Parallel()
	const keys, perKey = 10, 6
	bin := buildCaddyBinary(t)
	srv, _ := newRedis(t)
	var mu sync.Mutex
	execs := map[string]int{}
	be := newRecorder(t, func(w http.ResponseWriter, r *http.Request, s seen) {
		mu.Lock()
		execs[s.Key]++
		n := execs[s.Key]
		mu.Unlock()
		time.Sleep(500 * time.Millisecond)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"key":%q,"execution":%d,"fence":%q}`, s.Key, n, s.Fencing)
	})
	site := fmt.Sprintf(`	redis_lock /pay* {http.request.header.Idempotency-Key} {
		redis %s
		idempotency
	}
	reverse_proxy %s`, srv.Addr, be.hostPort())
	nodes := []*caddyProcess{
		startCaddyProcess(t, bin, "caddy-a", site),
		startCaddyProcess(t, bin, "caddy-b", site),
	}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: keys * perKey}}
	t.Cleanup(client.CloseIdleConnections)

	type answer struct {
		node int
		resp *response
	}
	answers := make(map[string][]answer)
	var amu sync.Mutex
	var wg sync.WaitGroup
	for i := range keys * perKey {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key, node := fmt.Sprintf("idem-e2e-%02d", i%keys), i%2
			r, err := sendRequest(context.Background(), client, "POST", nodes[node].URL+"/pay", `{"amount":100}`, "Idempotency-Key", key)
			if err != nil {
				t.Error(err)
				return
			}
			amu.Lock()
			answers[key] = append(answers[key], answer{node, r})
			amu.Unlock()
		}()
	}
	wg.Wait()
	for k := range keys {
		key := fmt.Sprintf("idem-e2e-%02d", k)
		var first *answer
		for _, a := range answers[key] {
			switch a.resp.Status {
			case 200:
				if first != nil {
					t.Errorf("%s: two 200 answers", key)
				}
				first = &a
			case http.StatusConflict:
			default:
				t.Errorf("%s: %s", key, a.resp)
			}
		}
		if first == nil {
			t.Fatalf("%s: no request ran", key)
		}
		other := nodes[1-first.node]
		r, err := sendRequest(context.Background(), client, "POST", other.URL+"/pay", `{"amount":100}`, "Idempotency-Key", key)
		if err != nil || r.Status != 200 || r.Body != first.resp.Body || r.Header.Get(replayedHeader) != "true" {
			t.Errorf("%s: retry on the other node: %v %v; want the stored %q", key, r, err, first.resp.Body)
		}
		r, err = sendRequest(context.Background(), client, "POST", other.URL+"/pay", `{"amount":200}`, "Idempotency-Key", key)
		if err != nil || r.Status != http.StatusUnprocessableEntity {
			t.Errorf("%s: another body on the other node: %v %v; want 422", key, r, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for k := range keys {
		key := fmt.Sprintf("idem-e2e-%02d", k)
		if execs[key] != 1 {
			t.Errorf("%s: %d executions, want 1", key, execs[key])
		}
	}
}
