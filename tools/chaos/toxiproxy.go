package main

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

// The network phase's fault proxy: Shopify's toxiproxy, installed as a tool
// with `go install` (never a dependency of the plugin's go.mod) and driven
// through its HTTP API.
const (
	toxiproxyModule  = "github.com/Shopify/toxiproxy/v2"
	toxiproxyVersion = "v2.12.0"
	toxiproxyPackage = toxiproxyModule + "/cmd/server" // its binary is named "server"
)

// toxiproxyInstall is the command that builds toxiproxy-server into gobin.
func toxiproxyInstall(gobin string) *exec.Cmd {
	cmd := exec.Command("go", "install", toxiproxyPackage+"@"+toxiproxyVersion)
	cmd.Dir = gobin // outside this module: go install pkg@version ignores go.mod anyway
	cmd.Env = append(os.Environ(), "GOBIN="+gobin, "GOWORK=off", "GOFLAGS=")
	return cmd
}

// installToxiproxy returns the path of toxiproxy-server v2.12.0: the one
// cached under the user's cache directory
// (caddy-redis-lock/toxiproxy-v2.12.0/toxiproxy-server), or, when there is
// none yet, one built there with go install from the Go module proxy.
// CHAOS_TOXIPROXY names a binary to use instead. It says on progress when
// it builds, and how long that took.
func installToxiproxy(progress io.Writer) (string, error) {
	if bin := os.Getenv("CHAOS_TOXIPROXY"); bin != "" {
		return bin, nil
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("toxiproxy: no cache directory: %w", err)
	}
	dir := filepath.Join(cache, "caddy-redis-lock", "toxiproxy-"+toxiproxyVersion)
	bin := filepath.Join(dir, "toxiproxy-server")
	if checkToxiproxy(bin) == nil {
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(dir, "install-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	cmd := toxiproxyInstall(tmp)
	fmt.Fprintf(progress, "chaos: installing toxiproxy: GOBIN=%s go install %s@%s\n", tmp, toxiproxyPackage, toxiproxyVersion)
	began := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go install %s@%s: %v\n%s", toxiproxyPackage, toxiproxyVersion, err, out)
	}
	built := filepath.Join(tmp, filepath.Base(toxiproxyPackage))
	if err := checkToxiproxy(built); err != nil {
		return "", err
	}
	// A rename, so that a run beside this one never sees half a binary.
	if err := os.Rename(built, bin); err != nil {
		return "", err
	}
	fmt.Fprintf(progress, "chaos: toxiproxy %s built in %v, cached as %s\n", toxiproxyVersion, time.Since(began).Round(100*time.Millisecond), bin)
	return bin, nil
}

// checkToxiproxy says whether bin is toxiproxy-server at toxiproxyVersion,
// by the module versions Go recorded in it (its -version flag prints "git"
// for a build by go install).
func checkToxiproxy(bin string) error {
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		return err
	}
	if info.Path != toxiproxyPackage || info.Main.Path != toxiproxyModule || info.Main.Version != toxiproxyVersion {
		return fmt.Errorf("%s is %s of %s %s, not %s of %s %s", bin, info.Path, info.Main.Path, info.Main.Version,
			toxiproxyPackage, toxiproxyModule, toxiproxyVersion)
	}
	return nil
}

// toxiproxyServer is a running toxiproxy-server, its API on loopback.
type toxiproxyServer struct {
	*toxiClient
	cmd    *exec.Cmd
	exited chan struct{}
}

// startToxiproxy runs bin with its API on a free loopback port, logging to
// dir/toxiproxy.log, and waits until the API answers.
func startToxiproxy(ctx context.Context, bin, dir string) (*toxiproxyServer, error) {
	port, err := redistest.FreePort()
	if err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(dir, "toxiproxy.log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(bin, "-host", "127.0.0.1", "-port", fmt.Sprint(port))
	cmd.Env = append(os.Environ(), "LOG_LEVEL=error")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = redistest.SysProcAttr() // dies with this process
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &toxiproxyServer{toxiClient: newToxiClient(fmt.Sprintf("http://127.0.0.1:%d", port)), cmd: cmd, exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(s.exited) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		vctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		_, err := s.version(vctx)
		cancel()
		if err == nil {
			return s, nil
		}
		select {
		case <-s.exited:
			return nil, fmt.Errorf("toxiproxy-server exited at start (log: %s)", logf.Name())
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			s.Close()
			return nil, fmt.Errorf("toxiproxy-server did not answer on 127.0.0.1:%d: %v", port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Close stops the server (SIGTERM, then SIGKILL after a while).
func (s *toxiproxyServer) Close() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(3 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
}

// toxiClient is toxiproxy's HTTP API, with net/http and encoding/json.
type toxiClient struct {
	base string // http://127.0.0.1:port
	http *http.Client
}

func newToxiClient(base string) *toxiClient {
	// Above the 25s the API gives a request: a removal waits for every
	// connection's toxic to hand on what it holds.
	return &toxiClient{base: base, http: &http.Client{Timeout: 30 * time.Second}}
}

// toxiProxy is a proxy as the API shows it.
type toxiProxy struct {
	Name     string  `json:"name"`
	Listen   string  `json:"listen"`
	Upstream string  `json:"upstream"`
	Enabled  bool    `json:"enabled"`
	Toxics   []toxic `json:"toxics,omitempty"`
}

// Streams of a toxic: upstream is what the client sends to the server
// (commands, requests), downstream what comes back (replies, answers).
const (
	upstream   = "upstream"
	downstream = "downstream"
)

// toxic is one toxic of a proxy. Toxicity is the chance that it applies to
// a connection, drawn per connection and direction when the toxic is added
// or the connection opens: 1 for every one (the API's default is 1 too,
// but an explicit 0 means never, so it is always sent).
type toxic struct {
	Name       string           `json:"name"`
	Type       string           `json:"type"`
	Stream     string           `json:"stream"`
	Toxicity   float64          `json:"toxicity"`
	Attributes map[string]int64 `json:"attributes"`
}

// String is the toxic as the fault log shows it.
func (t toxic) String() string {
	keys := make([]string, 0, len(t.Attributes))
	for k, v := range t.Attributes {
		keys = append(keys, fmt.Sprintf("%s %d", k, v))
	}
	slices.Sort(keys)
	s := t.Type + " " + t.Stream
	if len(keys) > 0 {
		s += " (" + strings.Join(keys, ", ") + ")"
	}
	if t.Toxicity != 1 {
		s += fmt.Sprintf(" toxicity %g", t.Toxicity)
	}
	return s
}

// apiError is toxiproxy's error body: {"error": "...", "status": 404}.
type apiError struct {
	Message string `json:"error"`
	Status  int    `json:"status"`
}

// do sends a request with body as JSON (unless nil) and decodes the answer
// into out (unless nil). A status outside 2xx is an error with the API's
// message.
func (c *toxiClient) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("toxiproxy %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("toxiproxy %s %s: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		var ae apiError
		if json.Unmarshal(raw, &ae) == nil && ae.Message != "" {
			return fmt.Errorf("toxiproxy %s %s: %s: %s", method, path, resp.Status, ae.Message)
		}
		return fmt.Errorf("toxiproxy %s %s: %s: %s", method, path, resp.Status, strings.TrimSpace(string(raw)))
	}
	if out == nil || len(raw) == 0 {
		return nil
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("toxiproxy %s %s: decoding %q: %w", method, path, raw, err)
	}
	return nil
}

// version is GET /version.
func (c *toxiClient) version(ctx context.Context) (string, error) {
	var v struct {
		Version string `json:"version"`
	}
	err := c.do(ctx, http.MethodGet, "/version", nil, &v)
	return v.Version, err
}

// createProxy is POST /proxies: a proxy listening on listen (loopback; port
// 0 picks a free one) to upstream, enabled. The answer says where it
// listens.
func (c *toxiClient) createProxy(ctx context.Context, name, listen, target string) (toxiProxy, error) {
	if !loopback(listen) {
		return toxiProxy{}, fmt.Errorf("toxiproxy: proxy %s would listen on %s, not on 127.0.0.1", name, listen)
	}
	var p toxiProxy
	err := c.do(ctx, http.MethodPost, "/proxies", toxiProxy{Name: name, Listen: listen, Upstream: target, Enabled: true}, &p)
	return p, err
}

// proxy is GET /proxies/{name}, with its toxics.
func (c *toxiClient) proxy(ctx context.Context, name string) (toxiProxy, error) {
	var p toxiProxy
	err := c.do(ctx, http.MethodGet, "/proxies/"+url.PathEscape(name), nil, &p)
	return p, err
}

// addToxic is POST /proxies/{proxy}/toxics.
func (c *toxiClient) addToxic(ctx context.Context, proxy string, t toxic) error {
	return c.do(ctx, http.MethodPost, "/proxies/"+url.PathEscape(proxy)+"/toxics", t, nil)
}

// updateToxic is PATCH /proxies/{proxy}/toxics/{name}: new attributes,
// the toxicity kept. Each connection's toxic is restarted with them.
func (c *toxiClient) updateToxic(ctx context.Context, proxy, name string, attrs map[string]int64) error {
	body := struct {
		Attributes map[string]int64 `json:"attributes"`
	}{attrs}
	return c.do(ctx, http.MethodPatch, "/proxies/"+url.PathEscape(proxy)+"/toxics/"+url.PathEscape(name), body, nil)
}

// removeToxic is DELETE /proxies/{proxy}/toxics/{name}: what a latency
// toxic holds is delivered, a timeout toxic closes its connections.
func (c *toxiClient) removeToxic(ctx context.Context, proxy, name string) error {
	return c.do(ctx, http.MethodDelete, "/proxies/"+url.PathEscape(proxy)+"/toxics/"+url.PathEscape(name), nil, nil)
}

// reset is POST /reset: every toxic removed, every proxy enabled.
func (c *toxiClient) reset(ctx context.Context) error {
	return c.do(ctx, http.MethodPost, "/reset", nil, nil)
}

// loopback says whether addr is 127.0.0.1:port.
func loopback(addr string) bool {
	host, _, ok := strings.Cut(addr, ":")
	return ok && host == "127.0.0.1"
}
