package redistest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// StartWithReplica starts a master and one replica of it, stopped when tb
// ends, and waits until the replica's link is up.
func StartWithReplica(tb testing.TB, extraArgs ...string) (master, replica *Server) {
	tb.Helper()
	common := append([]string{"--repl-diskless-sync-delay", "0"}, extraArgs...)
	master = Start(tb, common...)
	replica = Start(tb, append([]string{"--replicaof", "127.0.0.1", strconv.Itoa(master.Port)}, common...)...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := eventually(ctx, "replica attached", func(ctx context.Context) error {
		if err := replicaOf(ctx, replica.Addr, master.Port); err != nil {
			return err
		}
		if err := replicaOnline(ctx, master.Addr, replica.Port); err != nil {
			return err
		}
		return acknowledges(ctx, master.Addr)
	}); err != nil {
		tb.Fatal(err)
	}
	return master, replica
}

// replicaOnline checks that the master at addr counts its replica on
// replicaPort as online: the replica may report its link up while the
// master still waits for the end of the initial sync, and until then WAIT
// does not count it.
func replicaOnline(ctx context.Context, addr string, replicaPort int) error {
	info, err := DoString(ctx, addr, nil, "INFO", "replication")
	if err != nil {
		return fmt.Errorf("%s: %w", addr, err)
	}
	want := "port=" + strconv.Itoa(replicaPort) + ","
	for _, line := range strings.Split(info, "\n") {
		if strings.HasPrefix(line, "slave") && strings.Contains(line, want) {
			if strings.Contains(line, "state=online") {
				return nil
			}
			return fmt.Errorf("%s: %s", addr, strings.TrimSpace(line))
		}
	}
	return fmt.Errorf("%s does not list its replica on port %d", addr, replicaPort)
}

// acknowledges checks that a write on the master at addr is acknowledged by
// a replica within 100ms (WAIT): the first WAIT after a replica came
// online can time out before the replica's first acknowledgement.
func acknowledges(ctx context.Context, addr string) error {
	c, err := Dial(ctx, addr, nil)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.Do(ctx, "SET", "redistest:acknowledged", "1"); err != nil {
		return err
	}
	n, err := c.Do(ctx, "WAIT", "1", "100")
	if err != nil {
		return err
	}
	if n != int64(1) {
		return fmt.Errorf("%s: a write acknowledged by %v replicas, want 1", addr, n)
	}
	_, err = c.Do(ctx, "DEL", "redistest:acknowledged")
	return err
}

// CutReplicas puts the replicas of the master at masterAddr behind: the
// master drops its links to them (CLIENT KILL TYPE replica) and each is
// paused (SIGSTOP) before it reconnects, so that what the master writes
// from now on reaches none of them. Pausing alone is not enough: what the
// master sent waits in a paused replica's socket buffer and is applied when
// it resumes. Resume them with Resume.
func CutReplicas(ctx context.Context, masterAddr string, replicas ...*Server) error {
	kill := func() error {
		_, err := Do(ctx, masterAddr, nil, "CLIENT", "KILL", "TYPE", "replica")
		if err != nil {
			return fmt.Errorf("redistest: CLIENT KILL TYPE replica: %w", err)
		}
		return nil
	}
	if err := kill(); err != nil {
		return err
	}
	// A replica reconnects from its replication cron, once a second: it is
	// paused well before that, and a link it made all the same is dropped
	// once it is paused, so that nothing written from then on reaches it.
	for _, r := range replicas {
		if err := r.Pause(); err != nil {
			return err
		}
	}
	if err := kill(); err != nil {
		return err
	}
	info, err := DoString(ctx, masterAddr, nil, "INFO", "replication")
	if err != nil {
		return err
	}
	if n := InfoField(info, "connected_slaves"); n != "0" {
		return fmt.Errorf("redistest: %s still has %s replicas connected after the cut", masterAddr, n)
	}
	return nil
}
