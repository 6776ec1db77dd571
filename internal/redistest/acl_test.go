package redistest

import (
	"context"
	"crypto/tls"
	"errors"
	"testing"
	"time"
)

func TestACLUser(t *testing.T) {
	t.Parallel()
	s := Start(t)
	checkACLUser(t, s.Addr, nil)
}

func TestACLUserOverTLS(t *testing.T) {
	t.Parallel()
	s := StartTLS(t)
	checkACLUser(t, s.Addr, s.ClientConfig())
}

// checkACLUser gives a user only GET and SET on redis_lock:* and checks that
// it can do exactly that.
func checkACLUser(t *testing.T, addr string, conf *tls.Config) {
	t.Helper()
	ctx := Context(t, 30*time.Second)
	if err := SetACLUser(ctx, addr, conf, "user caddy on >secret resetkeys ~redis_lock:* -@all +get +set"); err != nil {
		t.Fatal(err)
	}
	c, err := Dial(ctx, addr, conf)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	wantErr := func(prefix string, args ...string) {
		t.Helper()
		_, err := c.Do(ctx, args...)
		var re *Error
		if !errors.As(err, &re) || re.Prefix() != prefix {
			t.Fatalf("%v: %v, want %s", args, err, prefix)
		}
	}
	wantErr("WRONGPASS", "AUTH", "caddy", "wrong")
	if _, err := c.Do(ctx, "AUTH", "caddy", "secret"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Do(ctx, "SET", "redis_lock:a", "1"); err != nil {
		t.Fatalf("SET on an allowed key: %v", err)
	}
	if got, err := c.Do(ctx, "GET", "redis_lock:a"); err != nil || got != "1" {
		t.Fatalf("GET on an allowed key: %v %v", got, err)
	}
	wantErr("NOPERM", "SET", "other:a", "1")
	wantErr("NOPERM", "DEL", "redis_lock:a")
	wantErr("NOPERM", "FLUSHALL")

	if err := DeleteACLUser(ctx, addr, conf, "caddy"); err != nil {
		t.Fatal(err)
	}
	if _, err := Do(ctx, addr, conf, "AUTH", "caddy", "secret"); err == nil {
		t.Fatal("a deleted user authenticated")
	}
	if err := SetACLUser(context.Background(), addr, conf, "user"); err == nil {
		t.Fatal("an ACL line without a name was accepted")
	}
}
