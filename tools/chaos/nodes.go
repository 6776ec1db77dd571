package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

// chaosPrefix is the prefix of every Redis key the nodes write.
const chaosPrefix = "chaos:"

// buildCaddy compiles the plugin's cmd/caddy (Caddy with the plugin) into dir once; the
// nodes are copies of that binary run as separate processes, so that one
// can be SIGKILLed. CHAOS_CADDY names a binary to use instead.
func buildCaddy(dir string) (string, error) {
	if bin := os.Getenv("CHAOS_CADDY"); bin != "" {
		return bin, nil
	}
	// The plugin's module: this tools module's replace points at it.
	dirOut, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/reqlock/caddy-redis-lock").Output()
	if err != nil {
		return "", fmt.Errorf("go list -m github.com/reqlock/caddy-redis-lock: %w", err)
	}
	root := strings.TrimSpace(string(dirOut))
	bin := filepath.Join(dir, "caddy")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/caddy")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building cmd/caddy: %v\n%s", err, out)
	}
	return bin, nil
}

// chaosRedis is the one Redis every node uses, with an append-only file
// fsynced on every write, in a directory of its own so that a restart
// "from its AOF" finds it and a restart "empty" can remove it.
type chaosRedis struct {
	*redistest.Server
	dataDir string
}

func startRedis(dir string) (*chaosRedis, error) {
	data := filepath.Join(dir, "redis-data")
	if err := os.MkdirAll(data, 0o700); err != nil {
		return nil, err
	}
	s, err := redistest.Launch("--appendonly", "yes", "--appendfsync", "always", "--dir", data)
	if err != nil {
		return nil, err
	}
	return &chaosRedis{Server: s, dataDir: data}, nil
}

// wipe removes the stopped server's data, so that Restart starts empty.
func (r *chaosRedis) wipe() error {
	entries, err := os.ReadDir(r.dataDir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(r.dataDir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// chaosSentinel is the failover phase's Redis: a master and a replica,
// each with an fsynced append-only file, and three Sentinels.
type chaosSentinel struct{ *redistest.Sentinel }

func startSentinel() (*chaosSentinel, error) {
	s, err := redistest.LaunchSentinel("--appendonly", "yes", "--appendfsync", "always")
	if err != nil {
		return nil, err
	}
	return &chaosSentinel{s}, nil
}

// redisLines are the nodes' redis block for the Sentinels, with replicas 1.
func (s *chaosSentinel) redisLines() []string {
	return []string{"mode sentinel", "master_name " + s.MasterName(), "address " + strings.Join(s.SentinelAddrs(), " "), "replicas 1"}
}

// nodeConfig is what a node's Caddyfile says.
type nodeConfig struct {
	Index      int
	Addr       string // the site, 127.0.0.1:port
	Admin      string // the admin endpoint, 127.0.0.1:port
	Backend    string
	Redis      string   // the address, or "" with RedisLines
	RedisLines []string // more lines of the redis block
	TTL        time.Duration
	Timeout    time.Duration // Redis command timeout
	LockOnly   bool          // no idempotency block
	Accounts   bool          // per-account serialisation: the lock keyed by X-Account, the record by Idempotency-Key
	Wait       time.Duration // redis_lock's wait; 0: none
	StorageDir string
}

// The headers a client sends its keys in; with Accounts, the account's is
// the directive's key (its lock) and the idempotency key the record's.
const (
	idempotencyHeader = "Idempotency-Key"
	accountHeader     = "X-Account"
)

// caddyfile is the node's configuration: one site, redis_lock keyed by
// Idempotency-Key in front of reverse_proxy to the backend; with Accounts,
// keyed by the account (X-Account), with `idempotency { key
// {http.request.header.Idempotency-Key} }`: one request of an account at a
// time, deduplicated by its idempotency key within the account.
func (c nodeConfig) caddyfile() string {
	key := "{http.request.header." + idempotencyHeader + "}"
	recordKey := ""
	if c.Accounts {
		key = "{http.request.header." + accountHeader + "}"
		recordKey = "\n\t\t\tkey {http.request.header." + idempotencyHeader + "}"
	}
	idem := `
		idempotency {` + recordKey + `
			retention 10m
		}`
	if c.LockOnly {
		idem = ""
	}
	wait := ""
	if c.Wait > 0 {
		wait = "\n\t\twait " + c.Wait.String()
	}
	more := ""
	for _, l := range c.RedisLines {
		more += "\n\t\t\t" + l
	}
	return fmt.Sprintf(`{
	admin %[1]s
	auto_https off
	persist_config off
	skip_install_trust
	storage file_system %[2]s
	grace_period 10s
	log {
		output stderr
		level WARN
	}
}

http://%[3]s {
	redis_lock /v1/charges* %[13]s {
		ttl %[4]s%[14]s
		prefix %[5]s
		redis %[6]s {
			timeout %[7]s
			dial_timeout %[7]s%[12]s
		}%[8]s
	}
	reverse_proxy %[9]s {
		header_up X-Chaos-Node %[10]d
		transport http {
			response_header_timeout %[11]s
		}
	}
}
`, c.Admin, c.StorageDir, c.Addr, c.TTL, chaosPrefix, c.Redis, c.Timeout, idem,
		c.Backend, c.Index, c.responseHeaderTimeout(), more, key, wait)
}

// responseHeaderTimeout is reverse_proxy's: the longest a node waits for
// the backend's answer before the outcome is unknown.
func (c nodeConfig) responseHeaderTimeout() time.Duration { return c.TTL + time.Second }

// node is one Caddy process.
type node struct {
	cfg     nodeConfig
	bin     string
	dir     string
	cfgPath string
	cmd     *exec.Cmd
	exited  chan struct{}
	starts  int
}

func newNode(bin, dir string, cfg nodeConfig) (*node, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	n := &node{cfg: cfg, bin: bin, dir: dir, cfgPath: filepath.Join(dir, "Caddyfile")}
	if err := os.WriteFile(n.cfgPath, []byte(cfg.caddyfile()), 0o600); err != nil {
		return nil, err
	}
	return n, n.start()
}

func (n *node) URL() string { return "http://" + n.cfg.Addr }

// start runs the node and waits until its site accepts connections.
func (n *node) start() error {
	n.starts++
	logf, err := os.OpenFile(filepath.Join(n.dir, "caddy.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "---- start %d at %s\n", n.starts, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(n.bin, "run", "--config", n.cfgPath, "--adapter", "caddyfile")
	cmd.Dir = n.dir
	cmd.Env = append(os.Environ(), "HOME="+n.dir, "XDG_CONFIG_HOME="+n.dir, "XDG_DATA_HOME="+n.dir)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = redistest.SysProcAttr() // dies with this process
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	n.cmd, n.exited = cmd, exited
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return fmt.Errorf("caddy node %d exited at start (log: %s)", n.cfg.Index, filepath.Join(n.dir, "caddy.log"))
		default:
		}
		if c, err := net.DialTimeout("tcp", n.cfg.Addr, 100*time.Millisecond); err == nil {
			c.Close()
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	n.kill()
	return fmt.Errorf("caddy node %d did not listen on %s within 20s", n.cfg.Index, n.cfg.Addr)
}

// kill sends SIGKILL and waits for the process to be gone.
func (n *node) kill() {
	if n.cmd == nil {
		return
	}
	_ = n.cmd.Process.Signal(syscall.SIGKILL)
	<-n.exited
	n.cmd = nil
}

// stop ends the node gracefully (SIGTERM), then kills it after a while.
func (n *node) stop() {
	if n.cmd == nil {
		return
	}
	_ = n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.exited:
		n.cmd = nil
	case <-time.After(5 * time.Second):
		n.kill()
	}
}

// reloadAPI posts the node's Caddyfile to the admin API's /load; Caddy
// adapts it (Content-Type text/caddyfile) and, told to revalidate, loads it
// although it did not change.
func (n *node) reloadAPI(ctx context.Context) error {
	body, err := os.ReadFile(n.cfgPath)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+n.cfg.Admin+"/load", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "text/caddyfile")
	req.Header.Set("Cache-Control", "must-revalidate")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		return fmt.Errorf("POST /load: %s: %s", resp.Status, strings.TrimSpace(b.String()))
	}
	return nil
}

// reloadCommand runs `caddy reload --force` against the node's admin endpoint.
func (n *node) reloadCommand(ctx context.Context) error {
	cmd := exec.CommandContext(ctx, n.bin, "reload", "--config", n.cfgPath, "--adapter", "caddyfile",
		"--address", n.cfg.Admin, "--force")
	cmd.Dir = n.dir
	cmd.Env = append(os.Environ(), "HOME="+n.dir, "XDG_CONFIG_HOME="+n.dir, "XDG_DATA_HOME="+n.dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("caddy reload: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// freeAddr is a free loopback address.
func freeAddr() (string, error) {
	p, err := redistest.FreePort()
	if err != nil {
		return "", err
	}
	return "127.0.0.1:" + strconv.Itoa(p), nil
}

// startNodes starts count nodes with their own ports and directories;
// links, unless nil, gives node i its own Redis and backend addresses.
func startNodes(bin, dir string, count int, base nodeConfig, links func(i int, c *nodeConfig)) ([]*node, error) {
	var nodes []*node
	for i := range count {
		cfg := base
		cfg.Index = i
		if links != nil {
			links(i, &cfg)
		}
		var err error
		if cfg.Addr, err = freeAddr(); err == nil {
			cfg.Admin, err = freeAddr()
		}
		if err != nil {
			stopNodes(nodes)
			return nil, err
		}
		nd := filepath.Join(dir, "node"+strconv.Itoa(i))
		cfg.StorageDir = filepath.Join(nd, "storage")
		n, err := newNode(bin, nd, cfg)
		if err != nil {
			stopNodes(nodes)
			return nil, errors.Join(err, logTail(filepath.Join(nd, "caddy.log")))
		}
		nodes = append(nodes, n)
	}
	return nodes, nil
}

func stopNodes(nodes []*node) {
	for _, n := range nodes {
		n.stop()
	}
}

// logTail is the end of a log file, as an error to join to another.
func logTail(path string) error {
	b, err := os.ReadFile(path)
	if err != nil || len(b) == 0 {
		return nil
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return errors.New(string(b))
}
