package redislock

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
	"github.com/reqlock/caddy-redis-lock/record"
)

// In idempotency mode, the answer is stored and the lock gone before the
// client's last write: a client that retries the moment it has its answer
// gets the replay, not 409.
func TestIdempotencyStoredBeforeLastByte(t *testing.T) {
	srv, rdb := newRedis(t)
	h := unitHandler(t, srv.Addr, func(h *Handler) { h.Idempotency = &IdempotencyConfig{} })
	key := engine.Key(DefaultPrefix, "", "k1")

	type state struct{ locked, stored bool }
	var at []state // per client-side write
	pw := newProbeWriter()
	pw.onWrite = func([]byte) {
		at = append(at, state{keyExists(t, rdb, key), recordCompleted(t, rdb, key)})
	}
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		w.Header().Set("Content-Length", "11")
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte("hello"))
		_, err := io.Copy(w, strings.NewReader(" world")) // the ReadFrom path
		return err
	})
	r, _ := unitRequest("POST", "k1", "")
	if err := h.ServeHTTP(pw, r, next); err != nil {
		t.Fatal(err)
	}
	if pw.body.String() != "hello world" {
		t.Fatalf("body %q", pw.body.String())
	}
	if len(at) < 2 || at[0] != (state{true, false}) || at[len(at)-1] != (state{false, true}) {
		t.Fatalf("(lock held, answer stored) at each client write = %v: want the lock held and nothing stored at the first, the answer stored and the lock gone at the last", at)
	}
}

// A record stored after its lock was lost (the checked completion) expires
// after retention like any other: without a TTL it would be replayed for
// ever.
func TestLateRecordExpiresAfterRetention(t *testing.T) {
	srv, rdb := newRedis(t)
	const retention = time.Hour
	h := unitHandler(t, srv.Addr, func(h *Handler) {
		fastRenew(h)
		h.LostLock = LostLockContinue
		h.Idempotency = &IdempotencyConfig{Retention: caddy.Duration(retention)}
	})
	key := engine.Key(DefaultPrefix, "", "k2")
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		if err := rdb.Del(context.Background(), key).Err(); err != nil {
			t.Error(err)
		}
		time.Sleep(500 * time.Millisecond) // renewals every 100ms find the lock gone
		w.WriteHeader(http.StatusCreated)
		_, err := w.Write([]byte("late"))
		return err
	})
	r, repl := unitRequest("POST", "k2", "")
	if err := h.ServeHTTP(newProbeWriter(), r, next); err != nil {
		t.Fatal(err)
	}
	if res, _ := repl.GetString(phResult); res != resultLost {
		t.Fatalf("result %q, want %q: the lock was not lost, so this is not the late path", res, resultLost)
	}
	ctx := context.Background()
	var pttl time.Duration
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		var err error
		if pttl, err = rdb.PTTL(ctx, record.Key(key)).Result(); err != nil {
			t.Fatal(err)
		}
		if pttl != -2*time.Nanosecond { // -2: not stored yet (the late completion runs in the background)
			break
		}
	}
	if pttl < retention-time.Minute || pttl > retention {
		t.Fatalf("the late record's PTTL is %v, want about the %v retention", pttl, retention)
	}
}
