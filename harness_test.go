package redislock

// The harness of the tests through Caddy itself: a Caddyfile is adapted with
// the real caddyfile adapter and loaded in-process with caddy.Load, each test
// with its own redis-server (internal/redistest) and its own backend.
// caddytest is not used: it wants fixed ports (admin 2999, 9080/9443), and a
// process can run only one Caddy config at a time anyway. The tests that
// call ServeHTTP directly, with a provisioned Handler and a real
// redis-server but no Caddy server around it, use unitHandler and
// unitRequest.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
	"github.com/redis/go-redis/v9"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
	"github.com/reqlock/caddy-redis-lock/internal/redistest"
	"github.com/reqlock/caddy-redis-lock/record"
)

// caddyMu serialises the tests that load a config: Caddy runs one config per
// process. Those tests still call t.Parallel, so that they overlap with the
// tests that need no running Caddy (adapt, direct ServeHTTP, e2e processes).
var caddyMu sync.Mutex

// caddySite is one running in-process Caddy config with one site.
type caddySite struct {
	t         testing.TB
	URL       string // http://127.0.0.1:port of the site
	AdminURL  string // empty when the admin endpoint is off
	caddyfile string
	client    *http.Client
}

// siteOptions are the parts of a test Caddyfile around the site body.
type siteOptions struct {
	admin  bool   // serve the admin API (for /metrics) on a free port
	global string // more global options, such as servers { timeouts { ... } }
}

// startCaddySite loads a Caddyfile with one site; body is the inside of the
// site block. Every test that calls it must call t.Parallel first (or not at
// all) and keeps the process-wide Caddy until it ends.
func startCaddySite(t testing.TB, body string, opt siteOptions) *caddySite {
	t.Helper()
	return startCaddySites(t, opt, body)[0]
}

// startCaddySites is startCaddySite with a site per body, each on its own
// port, in one config: nodes of one deployment, in one process.
func startCaddySites(t testing.TB, opt siteOptions, bodies ...string) []*caddySite {
	t.Helper()
	storage := t.TempDir()
	caddyMu.Lock()
	t.Cleanup(func() {
		if err := caddy.Stop(); err != nil {
			t.Logf("caddy.Stop: %v", err)
		}
		caddyMu.Unlock()
	})
	// A free port can be taken between the probe and Caddy's bind (as the
	// source port of an outgoing connection): then again, on new ports.
	var ports []int
	var cf, adminURL string
	for attempt := 1; ; attempt++ {
		ports, cf, adminURL = siteConfig(t, opt, storage, bodies)
		err := loadCaddyfileErr(cf)
		if err == nil {
			break
		}
		if attempt == 5 || !strings.Contains(err.Error(), "address already in use") {
			t.Fatalf("loading the test config: %v\n%s", err, cf)
		}
	}
	out := make([]*caddySite, len(ports))
	for i, port := range ports {
		out[i] = &caddySite{
			t:         t,
			URL:       fmt.Sprintf("http://127.0.0.1:%d", port),
			AdminURL:  adminURL,
			caddyfile: cf,
			client:    &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}},
		}
		t.Cleanup(out[i].client.CloseIdleConnections)
	}
	return out
}

// siteConfig is the Caddyfile of startCaddySites on free ports: the sites'
// ports, the Caddyfile and the admin API's URL (opt.admin).
func siteConfig(t testing.TB, opt siteOptions, storage string, bodies []string) ([]int, string, string) {
	t.Helper()
	admin := "admin off"
	adminURL := ""
	if opt.admin {
		ap := mustFreePort(t)
		admin = fmt.Sprintf("admin 127.0.0.1:%d", ap)
		adminURL = fmt.Sprintf("http://127.0.0.1:%d", ap)
	}
	ports := make([]int, len(bodies))
	var sites strings.Builder
	for i, body := range bodies {
		ports[i] = mustFreePort(t)
		fmt.Fprintf(&sites, "\nhttp://127.0.0.1:%d {\n%s\n}\n", ports[i], body)
	}
	cf := fmt.Sprintf(`{
	%s
	persist_config off
	auto_https off
	skip_install_trust
	grace_period 1s
	storage file_system %s
	log {
		level WARN
	}
%s
}
%s`, admin, storage, opt.global, sites.String())
	return ports, cf, adminURL
}

// paySite is the body of a test site with one locked route, /pay* keyed by
// the Idempotency-Key header and proxied to backend, shaped by opts.
func paySite(redisAddr, backend string, opts ...siteOption) string {
	var c paySiteConfig
	for _, o := range opts {
		o(&c)
	}
	var b strings.Builder
	b.WriteString("\tredis_lock /pay* {http.request.header.Idempotency-Key} {\n")
	fmt.Fprintf(&b, "\t\tredis %s%s\n", redisAddr, subBlock(c.redis, 2))
	for _, l := range c.lock {
		fmt.Fprintf(&b, "\t\t%s\n", l)
	}
	if c.idempotency != nil {
		fmt.Fprintf(&b, "\t\tidempotency%s\n", subBlock(*c.idempotency, 2))
	}
	fmt.Fprintf(&b, "\t}\n\treverse_proxy %s", backend)
	if len(c.transport) > 0 {
		fmt.Fprintf(&b, " {\n\t\ttransport http%s\n\t}", subBlock(c.transport, 2))
	}
	return b.String()
}

// paySiteConfig is what the options of paySite set.
type paySiteConfig struct {
	redis       []string  // inside redis <addr> { ... }
	lock        []string  // more redis_lock subdirectives
	idempotency *[]string // idempotency mode, with these subdirectives
	transport   []string  // inside reverse_proxy's transport http { ... }
}

type siteOption func(*paySiteConfig)

// lockLines adds redis_lock subdirectives ("ttl 1s", "wait 20s"), one a line.
func lockLines(lines ...string) siteOption {
	return func(c *paySiteConfig) { c.lock = append(c.lock, lines...) }
}

// redisLines adds subdirectives of the redis block ("timeout 300ms").
func redisLines(lines ...string) siteOption {
	return func(c *paySiteConfig) { c.redis = append(c.redis, lines...) }
}

// idempotent turns on idempotency mode, with these subdirectives (none: the
// bare idempotency directive).
func idempotent(lines ...string) siteOption {
	return func(c *paySiteConfig) {
		if c.idempotency == nil {
			c.idempotency = new([]string)
		}
		*c.idempotency = append(*c.idempotency, lines...)
	}
}

// proxyTransport adds subdirectives of reverse_proxy's transport http.
func proxyTransport(lines ...string) siteOption {
	return func(c *paySiteConfig) { c.transport = append(c.transport, lines...) }
}

// redisTimeout is the redis timeout of the sites with faultTimeouts: a
// client's answer may wait on Redis for at most twice that (one attempt and
// one retry).
const redisTimeout = 300 * time.Millisecond

// slack is what the answer may take beyond its bound on a busy 2-core VM.
const slack = 250 * time.Millisecond

// faultTimeouts gives Redis a timeout and a dial_timeout of redisTimeout,
// and proxies without keep-alive, so that idle upstream connections do not
// count in a goroutine baseline.
func faultTimeouts(c *paySiteConfig) {
	redisLines("timeout "+redisTimeout.String(), "dial_timeout "+redisTimeout.String())(c)
	proxyTransport("keepalive off")(c)
}

// storedAnswers is idempotency mode with a max_response of 4KiB and more
// subdirectives, behind an upstream that must send its headers within 1s.
func storedAnswers(lines ...string) siteOption {
	return func(c *paySiteConfig) {
		idempotent(append([]string{"max_response 4KiB"}, lines...)...)(c)
		proxyTransport("response_header_timeout 1s")(c)
	}
}

// subBlock is " {", lines and "}" for a subdirective at depth tabs, or ""
// when there are no lines.
func subBlock(lines []string, depth int) string {
	if len(lines) == 0 {
		return ""
	}
	in := strings.Repeat("\t", depth)
	var b strings.Builder
	b.WriteString(" {\n")
	for _, l := range lines {
		b.WriteString(in + "\t" + l + "\n")
	}
	b.WriteString(in + "}")
	return b.String()
}

// loadCaddyfile adapts cf and loads it (again, when already running).
func loadCaddyfile(t testing.TB, cf string) {
	t.Helper()
	cfgJSON, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cf), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatalf("adapting the test Caddyfile: %v\n%s", err, cf)
	}
	for _, w := range warnings {
		if !strings.Contains(w.Message, "not formatted") {
			t.Logf("adapt warning: %s", w)
		}
	}
	if err := caddy.Load(cfgJSON, true); err != nil {
		t.Fatalf("loading the test config: %v\n%s", err, cf)
	}
}

// loadCaddyfileErr loads cf and returns the error (the running config
// stays when there is one).
func loadCaddyfileErr(cf string) error {
	cfgJSON, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cf), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		return err
	}
	return caddy.Load(cfgJSON, true)
}

// reload loads the same Caddyfile again: a config reload as `caddy reload` does.
func (s *caddySite) reload() {
	s.t.Helper()
	loadCaddyfile(s.t, s.caddyfile)
	// The old servers closed their idle connections; a POST on one of
	// them would fail with EOF, as it would for any client.
	s.client.CloseIdleConnections()
	// A connection accepted while the old servers stop can still be closed
	// under a request (EOF, or a reset): wait until requests on new
	// connections get through several times in a row.
	for i, ok := 0, 0; i < 80 && ok < 5; i++ {
		s.client.CloseIdleConnections()
		if _, err := s.send(context.Background(), "GET", "/reload-probe", ""); err == nil {
			ok++
			continue
		}
		ok = 0
		time.Sleep(50 * time.Millisecond)
	}
	s.client.CloseIdleConnections()
}

// do sends a request to the site. hdr holds header name/value pairs.
func (s *caddySite) do(method, path, body string, hdr ...string) *response {
	s.t.Helper()
	return s.doCtx(context.Background(), method, path, body, hdr...)
}

func (s *caddySite) doCtx(ctx context.Context, method, path, body string, hdr ...string) *response {
	s.t.Helper()
	resp, err := s.send(ctx, method, path, body, hdr...)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	return resp
}

// send is do without t.Fatal, for goroutines.
func (s *caddySite) send(ctx context.Context, method, path, body string, hdr ...string) (*response, error) {
	return sendRequest(ctx, s.client, method, s.URL+path, body, hdr...)
}

// response is a finished response with its body read.
type response struct {
	Status int
	Header http.Header
	Body   string
}

func sendRequest(ctx context.Context, c *http.Client, method, url, body string, hdr ...string) (*response, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return nil, err
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	if body != "" && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("reading the body of %d: %w", resp.StatusCode, err)
	}
	return &response{Status: resp.StatusCode, Header: resp.Header, Body: string(b)}, nil
}

func (r *response) String() string {
	return fmt.Sprintf("%d %v %q", r.Status, r.Header, r.Body)
}

// problem is an RFC 9457 problem details body.
type problemDoc struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
}

// leakWords must never appear in an error body: they would tell a client
// about the Redis deployment behind the handler.
var leakWords = []string{"dial", "127.0.0.1", "redis:", "i/o timeout", "connection refused"}

// expectProblem checks that r is a problem+json response with status.
func expectProblem(t *testing.T, r *response, status int) problemDoc {
	t.Helper()
	if r.Status != status {
		t.Fatalf("status = %d, want %d (response %s)", r.Status, status, r)
	}
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/problem+json") {
		t.Errorf("Content-Type = %q, want application/problem+json", ct)
	}
	var p problemDoc
	if err := json.Unmarshal([]byte(r.Body), &p); err != nil {
		t.Fatalf("body is not JSON: %v: %q", err, r.Body)
	}
	if p.Status != status {
		t.Errorf("problem status = %d, want %d", p.Status, status)
	}
	if !strings.HasPrefix(p.Type, "https://") || p.Title == "" {
		t.Errorf("problem type %q / title %q: want an absolute type URI and a title", p.Type, p.Title)
	}
	for _, w := range leakWords {
		if strings.Contains(r.Body, w) {
			t.Errorf("error body leaks %q: %s", w, r.Body)
		}
	}
	return p
}

// retryAfter returns the Retry-After header as whole seconds, failing the
// test when it is absent, not an integer or below 1.
func retryAfter(t *testing.T, r *response) int {
	t.Helper()
	v := r.Header.Get("Retry-After")
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("Retry-After = %q, want whole seconds >= 1 (response %s)", v, r)
	}
	return n
}

// newRedis starts a redis-server for t and returns it with a client.
func newRedis(t *testing.T) (*redistest.Server, *redis.Client) {
	t.Helper()
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	return srv, rdb
}

// lockKeys lists the lock keys under prefix: not the fencing counters
// (<prefix>{<h4>}fence) nor idempotency records.
func lockKeys(t *testing.T, rdb *redis.Client, prefix string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	lockKey := regexp.MustCompile(`^` + regexp.QuoteMeta(prefix) + `\{[0-9a-f]{4}\}[0-9a-f]{64}$`)
	var keys []string
	iter := rdb.Scan(ctx, 0, prefix+"{*", 100).Iterator()
	for iter.Next(ctx) {
		if lockKey.MatchString(iter.Val()) {
			keys = append(keys, iter.Val())
		}
	}
	if err := iter.Err(); err != nil {
		t.Fatalf("SCAN: %v", err)
	}
	return keys
}

// holdLock writes a lock key directly into Redis, as another Caddy node
// holding it would.
func holdLock(t *testing.T, rdb *redis.Client, key string, ttl time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, key, "another-node", "1")
		p.PExpire(ctx, key, ttl)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func keyExists(t *testing.T, rdb *redis.Client, key string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n, err := rdb.Exists(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// recordCompleted reports whether the record of lockKey holds an outcome
// (not a request in progress, nor nothing).
func recordCompleted(t *testing.T, rdb *redis.Client, lockKey string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	head, err := rdb.GetRange(ctx, record.Key(lockKey), 0, 0).Result()
	if err != nil {
		t.Fatal(err)
	}
	return head == "C"
}

// untilAbandoned sends retry every 50ms while it is answered 409
// in-progress (a record whose lease ran out stays in progress a lease more,
// for a late holder), for at most within, and returns the first other
// answer, which must be the abandoned record's 502 outcome-unknown.
func untilAbandoned(t *testing.T, within time.Duration, retry func() *response) *response {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		r := retry()
		if r.Status != http.StatusConflict {
			if p := expectProblem(t, r, http.StatusBadGateway); p.Type != problemTypeBase+"outcome-unknown" ||
				r.Header.Get(shouldRetryHeader) != "false" || r.Header.Get(replayedHeader) != "true" {
				t.Fatalf("a retry of an abandoned record: %s, want the stored 502 outcome-unknown", r)
			}
			return r
		}
		if p := expectProblem(t, r, http.StatusConflict); p.Type != problemTypeBase+"in-progress" {
			t.Fatalf("a retry before the record is abandoned: %s, want 409 in-progress", r)
		}
		if time.Now().After(deadline) {
			t.Fatalf("still 409 in-progress %v after the lease ran out, want 502 outcome-unknown within a lease", within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// defaultKey is the Redis key of name with the default prefix and no scope.
func defaultKey(name string) string { return engine.Key(DefaultPrefix, "", name) }

func mustFreePort(t testing.TB) int {
	t.Helper()
	p, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// writeFile writes content into dir/name and returns the path.
func writeFile(t testing.TB, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// goroutineBaseline is the goroutine count once s is idle; checkBaseline
// waits until the handlers' background calls have ended and the count is
// back to it. The sites proxy without keep-alive,
// so that idle upstream connections do not count. The tests that take a
// baseline are not parallel, so that the goroutine count they compare
// belongs to them alone (parallel tests wait until every sequential one has
// finished).
func goroutineBaseline(s *caddySite) int {
	s.client.CloseIdleConnections()
	time.Sleep(100 * time.Millisecond)
	return runtime.NumGoroutine()
}

func checkBaseline(t *testing.T, s *caddySite, base int) {
	t.Helper()
	// A give-back that Redis did not answer is tried again in the
	// background for at least engine.GiveBackFor: the count is compared
	// once that work has ended.
	redistest.Eventually(t, 2*engine.GiveBackFor+5*time.Second, "the handlers' background calls to end", func() bool {
		for _, h := range activeHandlers() {
			if h.locker.InBackground() > 0 {
				return false
			}
		}
		return true
	})
	var n int
	deadline := time.Now().Add(15 * time.Second)
	for {
		s.client.CloseIdleConnections()
		if n = runtime.NumGoroutine(); n <= base {
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines after the fault, baseline %d:\n%s", n, base, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// unitHandler provisions a handler against the redis-server at addr.
func unitHandler(t testing.TB, addr string, modify func(*Handler)) *Handler {
	t.Helper()
	h := &Handler{Key: "{http.request.header.Idempotency-Key}", Redis: &RedisConfig{Addresses: []string{addr}}}
	if modify != nil {
		modify(h)
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	if err := h.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Cleanup() })
	if err := h.Validate(); err != nil {
		t.Fatal(err)
	}
	return h
}

// unitRequest is a request as Caddy hands it to a handler: with a replacer.
func unitRequest(method, key, body string) (*http.Request, *caddy.Replacer) {
	r := httptest.NewRequest(method, "/checkout", strings.NewReader(body))
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	return r, caddyhttp.NewTestReplacer(r)
}
