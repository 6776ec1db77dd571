package record

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

// A Redlock completion that comes within a call of its lease deadline
// (CallTimeout 2s, 1s left) runs the checked script, complete.lua, on every
// master, never the native SET and HDEL: those may reach a master after
// the lease has ended there, and another request may hold the key by then.
// Every master's commands are seen on the client (a hook per master).
func TestRedlockCompleteNearDeadlineIsChecked(t *testing.T) {
	s, masters := newRedlockStore(t) // CallTimeout 2s
	ctx := ctxT(t)
	key := engine.Key("test:", "", "redlock-near-deadline")
	p, err := s.Begin(ctx, key, fp("a"), time.Hour, engine.Options{TTL: 3 * time.Second, Renew: engine.NoRenew})
	if err != nil {
		t.Fatal(err)
	}
	const left = time.Second
	time.Sleep(time.Until(p.Deadline()) - left)
	for _, m := range masters {
		m.sent.Take() // the Begin's calls, those that went on in the background too
	}
	if l := time.Until(p.Deadline()); l < left/4 {
		t.Fatalf("%v left before the deadline when the test meant %v: too late to tell", l, left)
	}
	if err := p.Complete(ctx, okResponse, time.Minute); err != nil {
		t.Fatalf("Complete with %v left: %v", left, err)
	}
	// Complete returns once a majority has it; the last master follows.
	for i, m := range masters {
		redistest.Eventually(t, 5*time.Second, fmt.Sprintf("the record on master %d, its lock released", i), func() bool {
			return m.rdb.Exists(ctx, Key(key)).Val() == 1 && m.rdb.Exists(ctx, key).Val() == 0
		})
	}
	for i, m := range masters {
		cmds, _ := m.sent.Take()
		// A new connection's handshake is no part of the completion, nor
		// the test's own EXISTS.
		cmds = slices.DeleteFunc(cmds, func(c string) bool { return c == "hello" || c == "client" || c == "exists" })
		script := slices.Contains(cmds, "evalsha") || slices.Contains(cmds, "eval")
		if !script || slices.Contains(cmds, "set") || slices.Contains(cmds, "hdel") {
			t.Errorf("master %d got %s for a completion %v before its deadline, want complete.lua and no native SET or HDEL",
				i, strings.Join(cmds, " "), left)
		} else {
			t.Logf("master %d: %s", i, strings.Join(cmds, " "))
		}
	}
}
