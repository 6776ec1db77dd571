package floor

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/redis/go-redis/v9"

	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

// The floor holds its lock while next runs, answers only after the release,
// and refuses a key that is held.
func TestFloor(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rdb.Close()
	h := &Handler{Address: srv.Addr}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	if err := h.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	defer h.Cleanup()

	var heldDuring int64
	w := httptest.NewRecorder()
	err := h.ServeHTTP(w, request("k1"), caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		heldDuring = rdb.Exists(r.Context(), "redis_lock_floor:k1").Val()
		_, err := w.Write([]byte("charged"))
		return err
	}))
	if err != nil || w.Code != http.StatusOK || w.Body.String() != "charged" {
		t.Fatalf("answer %d %q, error %v", w.Code, w.Body, err)
	}
	if heldDuring != 1 {
		t.Fatal("no lock in Redis while next ran")
	}
	if n := rdb.Exists(ctx, "redis_lock_floor:k1").Val(); n != 0 {
		t.Fatal("lock left after the answer")
	}

	// A client gone while next ran: the lock is released all the same.
	gone, leave := context.WithCancel(context.Background())
	_ = h.ServeHTTP(httptest.NewRecorder(), request("k3").WithContext(gone), caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
		leave()
		return nil
	}))
	if n := rdb.Exists(ctx, "redis_lock_floor:k3").Val(); n != 0 {
		t.Fatal("lock left after the client went away")
	}

	rdb.Set(ctx, "redis_lock_floor:k2", "other", 0)
	err = h.ServeHTTP(httptest.NewRecorder(), request("k2"), caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
		t.Fatal("next ran under a held key")
		return nil
	}))
	if he, ok := err.(caddyhttp.HandlerError); !ok || he.StatusCode != http.StatusConflict {
		t.Fatalf("held key: %v, want a 409", err)
	}
}

func request(key string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	r.Header.Set("Idempotency-Key", key)
	return r
}
