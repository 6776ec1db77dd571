package redislock

import (
	"strings"
	"testing"
)

func TestRedisConfigSecrets(t *testing.T) {
	t.Setenv("REDISLOCK_TEST_PASSWORD", "hunter2")
	t.Setenv("REDISLOCK_TEST_ADDR", "127.0.0.1:7777")
	c := &RedisConfig{Mode: ModeSentinel, MasterName: "m", Addresses: []string{"{env.REDISLOCK_TEST_ADDR}"},
		Password: "{env.REDISLOCK_TEST_PASSWORD}", SentinelPassword: "s3cret"}
	rc, err := c.resolve()
	if err != nil {
		t.Fatal(err)
	}
	if rc.Password != "hunter2" || rc.Addresses[0] != "127.0.0.1:7777" {
		t.Fatalf("placeholders not resolved: %+v", rc.redacted())
	}
	if c.Password != "{env.REDISLOCK_TEST_PASSWORD}" {
		t.Fatal("resolve changed the configured value")
	}
	s := rc.String()
	if strings.Contains(s, "hunter2") || strings.Contains(s, "s3cret") || !strings.Contains(s, "REDACTED") {
		t.Errorf("String() leaks a secret: %s", s)
	}
	// Same settings share one pool entry; a different password does not.
	other := *rc
	other.Password = "other"
	if rc.poolKey() == other.poolKey() || strings.Contains(rc.poolKey(), "hunter2") {
		t.Error("pool key must depend on the password without containing it")
	}
}
