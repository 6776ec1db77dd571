package redisscript

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

// replyError is an error reply of Redis, as go-redis gives it.
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

func TestRetryCause(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want string
	}{
		{replyError("MOVED 3999 127.0.0.1:6381"), CauseMoved},
		{replyError("ASK 3999 127.0.0.1:6381"), CauseAsk},
		{replyError("TRYAGAIN Multiple keys request during rehashing of slot"), CauseTryAgain},
		{replyError("CLUSTERDOWN The cluster is down"), CauseClusterDown},
		{replyError("LOADING Redis is loading the dataset in memory"), CauseLoading},
		{replyError("READONLY You can't write against a read only replica."), CauseReadOnly},
		{replyError("MASTERDOWN Link with MASTER is down"), CauseMasterDown},
		{fmt.Errorf("wrapped: %w", replyError("TRYAGAIN x")), CauseTryAgain},
		{&ReplicationError{Acked: 0, Want: 1}, CauseUnreplicated},
		{&net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}, CauseConnection},
		{io.EOF, CauseConnection},
		{redis.ErrClosed, CauseConnection},
		// Answers, and ends that a retry would not change.
		{replyError("NOSCRIPT No matching script"), ""},
		{replyError("LATE 1700000000000000"), ""},
		{replyError("WRONGPASS invalid username-password pair"), ""},
		{fmt.Errorf("not connecting again: %w", replyError("WRONGPASS x")), ""},
		{replyError("CROSSSLOT Keys in request don't hash to the same slot"), ""},
		{context.DeadlineExceeded, ""},
		{context.Canceled, ""},
		{redis.ErrPoolTimeout, ""},
		{errors.New("redis: autopipeline queue full"), ""},
	} {
		if got := retryCause(tc.err); got != tc.want {
			t.Errorf("retryCause(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}

// counts is what a Conn's RetryObserver was told.
type counts struct {
	mu        sync.Mutex
	retries   map[string]int
	exhausted map[string]int
	retried   chan struct{} // gets one per retry
}

func observe(c *Conn) *counts {
	n := &counts{retries: map[string]int{}, exhausted: map[string]int{}, retried: make(chan struct{}, 1024)}
	c.ObserveRetries(func(cause string, exhausted bool) {
		n.mu.Lock()
		defer n.mu.Unlock()
		if exhausted {
			n.exhausted[cause]++
			return
		}
		n.retries[cause]++
		select {
		case n.retried <- struct{}{}:
		default:
		}
	})
	return n
}

func (n *counts) get() (retries, exhausted map[string]int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return maps(n.retries), maps(n.exhausted)
}

func maps(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// splitSlot is a Cluster of two masters (each with replicas replicas)
// whose slot of the keys a and b is migrating, with a already on the
// target and b still on the source, and a Conn on a cluster client of it
// (mk builds the Conn).
func splitSlot(t *testing.T, replicas int, mk func(*redis.ClusterClient) *Conn) (c *Conn, m *redistest.Migration, a, b string) {
	t.Helper()
	cl := redistest.StartCluster(t, 2, replicas)
	ctx := redistest.Context(t, time.Minute)
	a, b = "retry:{split}:a", "retry:{split}:b"
	slot := redistest.SlotOf(a)
	src, err := cl.MasterOfSlot(slot)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{a, b} {
		if _, err := redistest.Do(ctx, src, nil, "SET", k, k); err != nil {
			t.Fatal(err)
		}
	}
	if replicas > 0 {
		if _, err := redistest.Do(ctx, src, nil, "WAIT", fmt.Sprint(replicas), "5000"); err != nil {
			t.Fatal(err)
		}
	}
	var to string
	for _, addr := range cl.MasterAddrs() {
		if addr != src {
			to = addr
		}
	}
	if m, err = cl.StartMigration(ctx, slot, to); err != nil {
		t.Fatal(err)
	}
	if err := m.Move(ctx, a); err != nil {
		t.Fatal(err)
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = cc.Close() })
	return mk(cc), m, a, b
}

var both = New("return redis.call('GET', KEYS[1]) .. redis.call('GET', KEYS[2])")

// A script whose keys a slot migration splits between two nodes gets
// TRYAGAIN from both for as long as they are split: it is tried again
// until its deadline, never giving up before it, and runs once the keys
// are together again.
func TestRetryWhileSlotSplit(t *testing.T) {
	t.Parallel()
	c, m, a, b := splitSlot(t, 0, func(cc *redis.ClusterClient) *Conn { return NewConn(cc) })
	n := observe(c)

	const deadline = 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	start := time.Now()
	_, err := c.Run(ctx, both, []string{a, b})
	took := time.Since(start)
	cancel()
	var re *RetryError
	if !errors.As(err, &re) || re.Cause != CauseTryAgain || !redis.HasErrorPrefix(re.Err, "TRYAGAIN") {
		t.Fatalf("a script on keys split over two nodes: %v, want a RetryError of TRYAGAIN", err)
	}
	if took < deadline {
		t.Errorf("gave up after %v, before its %v deadline", took, deadline)
	}
	if err := Classify(ctx, err); !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &re) {
		t.Errorf("Classify at the deadline: %v, want the deadline with the RetryError", err)
	}
	if retries, exhausted := n.get(); retries[CauseTryAgain] < 1 || exhausted[CauseTryAgain] != 1 {
		t.Errorf("observed retries %v, exhausted %v: want tryagain in both, once exhausted", retries, exhausted)
	}

	// Within a longer deadline the keys come together on the target: the
	// source then has neither and answers ASK, which is followed.
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	moved := make(chan error, 1)
	go func() {
		<-n.retried
		<-n.retried
		moved <- m.Move(ctx, b)
	}()
	cmd, err := c.Run(ctx, both, []string{a, b})
	if err != nil || cmd.Val() != a+b {
		t.Fatalf("once the keys are together: %v %v, want %q", cmd.Val(), err, a+b)
	}
	if err := <-moved; err != nil {
		t.Fatal(err)
	}
	if _, err := m.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	if cmd, err := c.Run(ctx, both, []string{a, b}); err != nil || cmd.Val() != a+b {
		t.Fatalf("after the migration: %v %v", cmd.Val(), err)
	}
}

// A script sent with its WAIT on the master's own client, which go-redis
// does not redirect, follows an ASK to the node its keys moved to, and
// its WAIT counts that node's replicas.
func TestRetryFollowsAskWithReplicas(t *testing.T) {
	t.Parallel()
	c, m, a, _ := splitSlot(t, 1, func(cc *redis.ClusterClient) *Conn {
		return NewReplicatedConn(cc, Replication{Replicas: 1, Timeout: 5 * time.Second})
	})
	n := observe(c)
	ctx := redistest.Context(t, 30*time.Second)
	one := New("return redis.call('SET', KEYS[1], 'set on the target')")
	if _, err := c.Run(ctx, one, []string{a}); err != nil {
		t.Fatalf("a script and its WAIT on a key moved to the target: %v", err)
	}
	if retries, _ := n.get(); retries[CauseAsk] < 1 {
		t.Errorf("observed retries %v, want an ask", retries)
	}
	if err := m.MoveAll(ctx, 10, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := c.Client().Get(ctx, a).Result()
	if err != nil || got != "set on the target" {
		t.Fatalf("GET after the migration: %q %v", got, err)
	}
}
