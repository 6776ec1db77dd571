package engine

import (
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/reqlock/caddy-redis-lock/internal/redisscript"
	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

// readScript reads a .lua file of the package as shipped.
func readScript(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestScriptsAreTheEmbeddedFiles(t *testing.T) {
	for _, tc := range []struct {
		files  []string
		script redisscript.Script
	}{
		{[]string{"../redisscript/take.lua", "acquire.lua"}, acquireScript},
		{[]string{"refresh.lua"}, refreshScript},
	} {
		var file string
		for _, f := range tc.files {
			file += readScript(t, f)
		}
		if file == "" || tc.script.Src != file {
			t.Errorf("%v: embedded source differs from the files", tc.files)
		}
		sum := sha1.Sum([]byte(file))
		if tc.script.SHA != hex.EncodeToString(sum[:]) {
			t.Errorf("%v: script hash %s is not the source's SHA1", tc.files, tc.script.SHA)
		}
	}
	// Refresh is PEXPIRE on a string key, never HEXPIRE (hash fields).
	if !containsWord(refreshSrc, "PEXPIRE") || containsWord(refreshSrc, "HEXPIRE") {
		t.Error("refresh.lua must use PEXPIRE, not HEXPIRE")
	}
}

func containsWord(src, w string) bool {
	return strings.Contains(src, "'"+w+"'") || strings.Contains(src, `"`+w+`"`)
}

// After SCRIPT FLUSH (as after a failover) every call still works: EVALSHA
// gets NOSCRIPT and the call falls back to EVAL, which reloads the script.
func TestScriptFlushFallsBackToEval(t *testing.T) {
	srv, admin := startRedis(t)
	hook := &redistest.Commands{}
	c := New(newRDB(t, srv.Addr, hook), nil)
	ctx := ctxT(t)
	key := testKey(t)
	flush := func() {
		t.Helper()
		if err := admin.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		hook.Take()
	}
	wantFallback := func(what string) {
		t.Helper()
		if cmds, _ := hook.Take(); !slices.Equal(cmds, []string{"evalsha", "eval"}) {
			t.Fatalf("%s after SCRIPT FLUSH sent %v, want [evalsha eval]", what, cmds)
		}
	}

	// Open the connection first, and let the first acquire read the
	// server's clock (TIME): neither is the subject.
	if err := c.Backend().(*Redis).conn.Client().Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if warm, err := c.Acquire(ctx, key+":warm", Options{TTL: time.Minute}); err != nil {
		t.Fatal(err)
	} else if err := warm.Release(ctx); err != nil {
		t.Fatal(err)
	}
	flush()
	l, err := c.Acquire(ctx, key, Options{TTL: time.Minute, Renew: NoRenew})
	if err != nil {
		t.Fatalf("Acquire after SCRIPT FLUSH: %v", err)
	}
	wantFallback("Acquire")
	// EVAL loaded it again: the next call is one EVALSHA.
	if _, err := c.Acquire(ctx, key, Options{TTL: time.Minute}); !errors.Is(err, ErrNotObtained) {
		t.Fatalf("contended Acquire: %v", err)
	}
	if cmds, _ := hook.Take(); !slices.Equal(cmds, []string{"evalsha"}) {
		t.Fatalf("second Acquire sent %v", cmds)
	}

	flush()
	if err := l.Refresh(ctx, 2*time.Minute); err != nil {
		t.Fatalf("Refresh after SCRIPT FLUSH: %v", err)
	}
	wantFallback("Refresh")
	if pttl := admin.PTTL(ctx, key).Val(); pttl <= time.Minute {
		t.Fatalf("PTTL after Refresh = %v", pttl)
	}

	// Release is no script: HDEL, whatever the script cache holds.
	flush()
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release after SCRIPT FLUSH: %v", err)
	}
	if cmds, _ := hook.Take(); !slices.Equal(cmds, []string{"hdel"}) {
		t.Fatalf("Release after SCRIPT FLUSH sent %v, want [hdel]", cmds)
	}
	if n := admin.Exists(ctx, key).Val(); n != 0 {
		t.Fatal("lock still in Redis after Release")
	}
}
