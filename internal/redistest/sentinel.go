package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// SentinelDownAfter is the down-after-milliseconds of the Sentinels: a killed
// master is noticed within about a second, which keeps KillMaster fast.
const SentinelDownAfter = 1000 * time.Millisecond

// sentinelFailoverTimeout bounds one failover attempt and spaces automatic
// retries (twice this); small so that a stuck attempt is retried in a test's
// lifetime.
const sentinelFailoverTimeout = 5 * time.Second

// Sentinel is a master, one replica and three Sentinels (quorum 2) on
// 127.0.0.1. The two data nodes swap roles on failover: ask MasterAddr. Its
// methods must not run concurrently with Stop or Restart of its servers.
type Sentinel struct {
	name      string
	data      []*Server
	byAddr    map[string]*Server
	sentinels []*Server
}

// StartSentinel starts a Sentinel topology, stopped when tb ends. extraArgs go
// to the two data servers (not to the Sentinels).
func StartSentinel(tb testing.TB, extraArgs ...string) *Sentinel {
	tb.Helper()
	Require(tb)
	s, err := LaunchSentinel(extraArgs...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Close)
	return s
}

// LaunchSentinel starts a Sentinel topology and waits until every Sentinel
// knows the master, the replica and the two other Sentinels; the caller must
// Close it.
func LaunchSentinel(extraArgs ...string) (*Sentinel, error) {
	s := &Sentinel{name: "redistest", byAddr: map[string]*Server{}}
	if err := s.launch(extraArgs); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func (s *Sentinel) launch(extraArgs []string) error {
	// Initial sync without the default 5s wait for more replicas.
	common := append([]string{"--repl-diskless-sync-delay", "0"}, extraArgs...)
	master, err := launch(spec{args: common})
	if err != nil {
		return err
	}
	s.add(master)
	replica, err := launch(spec{args: append([]string{"--replicaof", "127.0.0.1", strconv.Itoa(master.Port)}, common...)})
	if err != nil {
		return err
	}
	s.add(replica)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Sentinels started after the replica is attached find it in the
	// master's first INFO instead of ten seconds later.
	err = eventually(ctx, "replica attached", func(ctx context.Context) error {
		return replicaOf(ctx, replica.Addr, master.Port)
	})
	if err != nil {
		return err
	}
	for range 3 {
		sn, err := launch(spec{
			head: func(dir string, port int) ([]string, error) {
				return s.writeConf(dir, port, master.Port)
			},
		})
		if err != nil {
			return err
		}
		s.sentinels = append(s.sentinels, sn)
	}
	_, err = s.waitStable(ctx, "")
	return err
}

func (s *Sentinel) add(srv *Server) {
	s.data = append(s.data, srv)
	s.byAddr[srv.Addr] = srv
}

// writeConf writes a Sentinel config: Sentinel rewrites its file at run time,
// so each needs its own writable one.
func (s *Sentinel) writeConf(dir string, port, masterPort int) ([]string, error) {
	ms := func(d time.Duration) string { return strconv.Itoa(int(d / time.Millisecond)) }
	conf := strings.Join([]string{
		"port " + strconv.Itoa(port),
		"bind 127.0.0.1",
		"sentinel resolve-hostnames no",
		fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 2", s.name, masterPort),
		fmt.Sprintf("sentinel down-after-milliseconds %s %s", s.name, ms(SentinelDownAfter)),
		fmt.Sprintf("sentinel failover-timeout %s %s", s.name, ms(sentinelFailoverTimeout)),
		fmt.Sprintf("sentinel parallel-syncs %s 1", s.name),
	}, "\n") + "\n"
	path := filepath.Join(dir, "sentinel.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		return nil, err
	}
	return []string{path, "--sentinel"}, nil
}

// MasterName returns the name the Sentinels monitor the master under.
func (s *Sentinel) MasterName() string { return s.name }

// SentinelAddrs returns the Sentinels' addresses.
func (s *Sentinel) SentinelAddrs() []string {
	out := make([]string, len(s.sentinels))
	for i, sn := range s.sentinels {
		out[i] = sn.Addr
	}
	return out
}

// Addrs returns the two data servers' addresses, in start order (master
// first at start; roles move on failover).
func (s *Sentinel) Addrs() []string {
	out := make([]string, len(s.data))
	for i, d := range s.data {
		out[i] = d.Addr
	}
	return out
}

// Node returns the data server or Sentinel at addr, or nil. A restarted data
// server comes back with its original flags; the Sentinels turn it into a
// replica of the current master within about ten seconds (WaitStable).
func (s *Sentinel) Node(addr string) *Server {
	if d := s.byAddr[addr]; d != nil {
		return d
	}
	for _, sn := range s.sentinels {
		if sn.Addr == addr {
			return sn
		}
	}
	return nil
}

// Replica is the data server that is not the one at masterAddr.
func (s *Sentinel) Replica(masterAddr string) *Server {
	for _, d := range s.data {
		if d.Addr != masterAddr {
			return d
		}
	}
	return nil
}

// MasterAddr asks the Sentinels, in turn, for the current master address.
func (s *Sentinel) MasterAddr(ctx context.Context) (string, error) {
	err := errors.New("redistest: no Sentinel running")
	for _, sn := range s.sentinels {
		if !sn.Running() {
			continue
		}
		var addr string
		if addr, err = s.masterFrom(ctx, sn.Addr); err == nil {
			return addr, nil
		}
	}
	return "", err
}

func (s *Sentinel) masterFrom(ctx context.Context, sentinelAddr string) (string, error) {
	v, err := Do(ctx, sentinelAddr, nil, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", s.name)
	if err != nil {
		return "", err
	}
	a, ok := v.([]any)
	if !ok || len(a) != 2 {
		return "", fmt.Errorf("redistest: GET-MASTER-ADDR-BY-NAME replied %v", v)
	}
	host, _ := replyString(a[0])
	port, _ := replyString(a[1])
	return net.JoinHostPort(host, port), nil
}

// Failover asks the Sentinels for a failover (SENTINEL FAILOVER, the old
// master stays up) and waits until they agree on the new master, it reports
// role:master and the old master is its attached replica. It returns the new
// master's address. Expect about ten seconds: the Sentinels wait about eight
// before turning the still-running old master into a replica, and until then
// it keeps accepting writes, as in production.
func (s *Sentinel) Failover(ctx context.Context) (string, error) {
	old, err := s.waitStable(ctx, "")
	if err != nil {
		return "", err
	}
	var asked *Server
	for _, sn := range s.sentinels {
		if sn.Running() {
			asked = sn
			break
		}
	}
	if asked == nil {
		return "", errors.New("redistest: no Sentinel running")
	}
	for {
		_, err := Do(ctx, asked.Addr, nil, "SENTINEL", "FAILOVER", s.name)
		var re *Error
		if err == nil || errors.As(err, &re) && re.Prefix() == "INPROG" {
			break // INPROG: one is under way already, wait for it
		}
		// NOGOODSLAVE: the Sentinel has not refreshed the replica yet. Any
		// other error is returned rather than retried, since a command that
		// timed out may have started a failover that a retry would repeat.
		if !errors.As(err, &re) || re.Prefix() != "NOGOODSLAVE" {
			return "", err
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("redistest: SENTINEL FAILOVER: %w", err)
		case <-time.After(200 * time.Millisecond):
		}
	}
	return s.waitStable(ctx, old)
}

// KillMaster stops the master process hard (SIGKILL) and waits until the
// Sentinels have promoted the replica. It returns the new master's address;
// the old one stays down until Node(old).Restart().
func (s *Sentinel) KillMaster(ctx context.Context) (string, error) {
	old, err := s.waitStable(ctx, "")
	if err != nil {
		return "", err
	}
	s.byAddr[old].Stop()
	return s.waitStable(ctx, old)
}

// WaitStable waits until every running Sentinel names the same master with
// no failover under way and sees the two other Sentinels, that master reports
// role:master, and every other running data server is its replica with the
// link up and is known to every Sentinel as a healthy replica. It returns the
// master's address.
func (s *Sentinel) WaitStable(ctx context.Context) (string, error) { return s.waitStable(ctx, "") }

// WaitStableWithout is WaitStable with a master other than old: after old
// was stopped by hand, it waits for the failover.
func (s *Sentinel) WaitStableWithout(ctx context.Context, old string) (string, error) {
	return s.waitStable(ctx, old)
}

func (s *Sentinel) waitStable(ctx context.Context, notMaster string) (string, error) {
	var master string
	err := eventually(ctx, "sentinel topology stable", func(ctx context.Context) error {
		var err error
		master, err = s.checkStable(ctx, notMaster)
		return err
	})
	return master, err
}

func (s *Sentinel) checkStable(ctx context.Context, notMaster string) (string, error) {
	var master string
	for _, sn := range s.sentinels {
		if !sn.Running() {
			continue
		}
		m, err := s.masterFrom(ctx, sn.Addr)
		if err != nil {
			return "", fmt.Errorf("sentinel %s: %w", sn.Addr, err)
		}
		if master != "" && m != master {
			return "", fmt.Errorf("sentinels disagree: %s and %s", master, m)
		}
		master = m
		v, err := Do(ctx, sn.Addr, nil, "SENTINEL", "MASTER", s.name)
		if err != nil {
			return "", fmt.Errorf("sentinel %s: %w", sn.Addr, err)
		}
		f := pairs(v)
		if f["flags"] != "master" {
			return "", fmt.Errorf("sentinel %s: master %s flags %s", sn.Addr, m, f["flags"])
		}
		if f["num-other-sentinels"] != strconv.Itoa(len(s.sentinels)-1) {
			return "", fmt.Errorf("sentinel %s knows %s other sentinels", sn.Addr, f["num-other-sentinels"])
		}
	}
	if master == "" {
		return "", errors.New("no Sentinel running")
	}
	if master == notMaster {
		return "", fmt.Errorf("master is still %s", master)
	}
	m := s.byAddr[master]
	if m == nil || !m.Running() {
		return "", fmt.Errorf("master %s is not a running data server", master)
	}
	info, err := DoString(ctx, master, nil, "INFO", "replication")
	if err != nil {
		return "", fmt.Errorf("master %s: %w", master, err)
	}
	if role := InfoField(info, "role"); role != "master" {
		return "", fmt.Errorf("master %s reports role:%s", master, role)
	}
	for _, d := range s.data {
		if d == m || !d.Running() {
			continue
		}
		if err := replicaOf(ctx, d.Addr, m.Port); err != nil {
			return "", err
		}
		for _, sn := range s.sentinels {
			if !sn.Running() {
				continue
			}
			if err := s.knowsReplica(ctx, sn.Addr, d.Addr); err != nil {
				return "", err
			}
		}
	}
	return master, nil
}

// knowsReplica checks that a Sentinel lists addr as a replica it could
// promote: no down or disconnected flag.
func (s *Sentinel) knowsReplica(ctx context.Context, sentinelAddr, addr string) error {
	v, err := Do(ctx, sentinelAddr, nil, "SENTINEL", "REPLICAS", s.name)
	if err != nil {
		return fmt.Errorf("sentinel %s: %w", sentinelAddr, err)
	}
	list, _ := v.([]any)
	for _, e := range list {
		f := pairs(e)
		if f["name"] != addr {
			continue
		}
		if f["flags"] != "slave" {
			return fmt.Errorf("sentinel %s: replica %s flags %s", sentinelAddr, addr, f["flags"])
		}
		return nil
	}
	return fmt.Errorf("sentinel %s does not know replica %s", sentinelAddr, addr)
}

// replicaOf checks that addr is a replica of 127.0.0.1:masterPort with its
// link up.
func replicaOf(ctx context.Context, addr string, masterPort int) error {
	info, err := DoString(ctx, addr, nil, "INFO", "replication")
	if err != nil {
		return fmt.Errorf("%s: %w", addr, err)
	}
	if role := InfoField(info, "role"); role != "slave" {
		return fmt.Errorf("%s reports role:%s", addr, role)
	}
	if p := InfoField(info, "master_port"); p != strconv.Itoa(masterPort) {
		return fmt.Errorf("%s replicates port %s, want %d", addr, p, masterPort)
	}
	if st := InfoField(info, "master_link_status"); st != "up" {
		return fmt.Errorf("%s: master_link_status:%s", addr, st)
	}
	return nil
}

// Close stops the Sentinels first (so they do not react to the data servers
// going away), then the data servers.
func (s *Sentinel) Close() {
	for _, sn := range s.sentinels {
		sn.Close()
	}
	for _, d := range s.data {
		d.Close()
	}
}

// pairs turns a flat [field, value, field, value...] array (SENTINEL MASTER,
// SENTINEL REPLICAS entries) into a map.
func pairs(v any) map[string]string {
	a, _ := v.([]any)
	m := make(map[string]string, len(a)/2)
	for i := 0; i+1 < len(a); i += 2 {
		k, _ := replyString(a[i])
		val, _ := replyString(a[i+1])
		m[k] = val
	}
	return m
}
