package engine

import (
	"errors"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

func TestKeyKnownVector(t *testing.T) {
	// printf 'idem\0abc-123' | sha256sum
	const want = "redis_lock:{e986}e986f6af1489bb794e6f0da5d0d1748f2de3714348952ac2aba611289f3f5760"
	if got := Key(DefaultPrefix, "idem", "abc-123"); got != want {
		t.Fatalf("Key = %q, want %q", got, want)
	}
	// printf '\0' | sha256sum: empty scope and name still hash the separator.
	if got := Key("p:", "", ""); got != "p:{6e34}6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d" {
		t.Fatalf("Key(empty) = %q", got)
	}
	// The separator keeps (scope, name) pairs apart.
	if Key("", "ab", "c") == Key("", "a", "bc") {
		t.Fatal("Key does not separate scope from name")
	}
	k := Key("x", "s", "N")
	if m := regexp.MustCompile(`^x\{([0-9a-f]{4})\}([0-9a-f]{64})$`).FindStringSubmatch(k); m == nil || m[1] != m[2][:4] {
		t.Fatalf("Key is not prefix{h[:4]}h with h the lowercase hex sha256: %q", k)
	}
	// The counter shares the lock's hash tag; keys without one share one.
	for key, want := range map[string]string{
		"p:{6e34}6e340b9c":    "p:{6e34}fence",
		"p:{6e34}6e34:result": "p:{6e34}fence",
		"plain-key":           untaggedCounterKey,
		"p:{}x":               untaggedCounterKey,
		"p:{unclosed":         untaggedCounterKey,
		"{a}b{c}":             "{a}fence",
	} {
		if got := CounterKey(key); got != want {
			t.Errorf("CounterKey(%q) = %q, want %q", key, got, want)
		}
	}
}

func TestAcquireAndReleaseOneRoundTrip(t *testing.T) {
	srv, admin := startRedis(t)
	hook := &redistest.Commands{}
	c := New(newRDB(t, srv.Addr, hook), nil)
	ctx := ctxT(t)
	key := testKey(t)

	// Warm-up: open the connection and load the scripts.
	for range 2 {
		l, err := c.Acquire(ctx, key, Options{TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	hook.Take()
	if err := admin.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	for i := range 5 {
		l, err := c.Acquire(ctx, key, Options{TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if cmds, _ := hook.Take(); len(cmds) != 1 || cmds[0] != "evalsha" {
			t.Fatalf("cycle %d: uncontended Acquire sent %v, want exactly [evalsha]", i, cmds)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if cmds, _ := hook.Take(); len(cmds) != 1 || cmds[0] != "hdel" {
			t.Fatalf("cycle %d: Release sent %v, want exactly [hdel]", i, cmds)
		}
	}
	// The server agrees: 5 script calls, no EVAL fallback, 5 HDEL.
	if n := redistest.Calls(t, srv.Addr, "evalsha"); n != 5 {
		t.Fatalf("server saw %d EVALSHA, want 5", n)
	}
	if n := redistest.Calls(t, srv.Addr, "hdel"); n != 5 {
		t.Fatalf("server saw %d HDEL, want 5", n)
	}
	if n := redistest.Calls(t, srv.Addr, "eval"); n != 0 {
		t.Fatalf("server saw %d EVAL, want 0", n)
	}

	// Contention is one round trip as well.
	holder := mustAcquire(t, c, key, Options{TTL: time.Minute})
	hook.Take()
	if _, err := c.Acquire(ctx, key, Options{TTL: time.Minute}); !errors.Is(err, ErrNotObtained) {
		t.Fatalf("contended Acquire: %v", err)
	}
	if cmds, _ := hook.Take(); len(cmds) != 1 {
		t.Fatalf("contended Acquire sent %v, want one command", cmds)
	}
	_ = holder
}

func TestAcquireContentionReportsRemaining(t *testing.T) {
	_, rdb := startRedis(t)
	c := New(rdb, nil)
	ctx := ctxT(t)
	key := testKey(t)
	const ttl = 20 * time.Second
	mustAcquire(t, c, key, Options{TTL: ttl, Renew: NoRenew})

	_, err := c.Acquire(ctx, key, Options{TTL: time.Second})
	pttl := rdb.PTTL(ctx, key).Val()
	var ne *NotObtainedError
	if !errors.As(err, &ne) || !errors.Is(err, ErrNotObtained) {
		t.Fatalf("Acquire on a held key: %v, want *NotObtainedError", err)
	}
	if ne.Remaining <= 0 || ne.Remaining > ttl {
		t.Fatalf("Remaining = %v, want in (0, %v]", ne.Remaining, ttl)
	}
	// Read after the attempt, so PTTL <= Remaining, by no more than the
	// time between the two calls.
	if d := ne.Remaining - pttl; d < 0 || d > 2*time.Second {
		t.Fatalf("Remaining = %v, holder's PTTL = %v", ne.Remaining, pttl)
	}
	if !strings.Contains(err.Error(), "not obtained") {
		t.Fatalf("error text %q", err)
	}
}

func TestAcquireTokenIsUUIDv4(t *testing.T) {
	_, rdb := startRedis(t)
	c := New(rdb, nil)
	seen := map[string]bool{}
	for i := range 20 {
		l := mustAcquire(t, c, testKey(t)+strconv.Itoa(i), Options{TTL: time.Minute})
		u, err := uuid.Parse(l.Token())
		if err != nil {
			t.Fatalf("token %q: %v", l.Token(), err)
		}
		if u.Version() != 4 || u.Variant() != uuid.RFC4122 {
			t.Fatalf("token %q is version %v variant %v, want a random UUIDv4", l.Token(), u.Version(), u.Variant())
		}
		if l.Token() != u.String() {
			t.Fatalf("token %q is not in canonical form", l.Token())
		}
		if seen[l.Token()] {
			t.Fatalf("token %q repeated", l.Token())
		}
		seen[l.Token()] = true
	}
}

func TestAcquireKeyLayout(t *testing.T) {
	_, rdb := startRedis(t)
	ctx := ctxT(t)
	key := Key("app:", "idem", "order-42")
	l := mustAcquire(t, New(rdb, nil), key, Options{TTL: time.Minute})

	if l.Key() != key {
		t.Fatalf("Lock.Key = %q, want %q", l.Key(), key)
	}
	// The lock is a hash: one field, the holder's token, whose value is
	// the fencing token.
	if typ := rdb.Type(ctx, key).Val(); typ != "hash" {
		t.Fatalf("TYPE lock = %q, want hash", typ)
	}
	if got := rdb.HGetAll(ctx, key).Val(); len(got) != 1 || got[l.Token()] != strconv.FormatInt(l.Fence(), 10) {
		t.Fatalf("HGETALL %s = %v, want {%s: %d}", key, got, l.Token(), l.Fence())
	}
	if pttl := rdb.PTTL(ctx, key).Val(); pttl <= 50*time.Second || pttl > time.Minute {
		t.Fatalf("lock PTTL = %v, want about 1m", pttl)
	}
	// The fencing counter: the last token issued, never expiring.
	fk := CounterKey(key)
	n, err := rdb.Get(ctx, fk).Int64()
	if err != nil || n != l.Fence() {
		t.Fatalf("GET %s = %d, %v; want the fence %d", fk, n, err, l.Fence())
	}
	if pttl := rdb.PTTL(ctx, fk).Val(); pttl >= 0 {
		t.Fatalf("counter PTTL = %v, want no expiry", pttl)
	}
	keys := rdb.Keys(ctx, "*").Val()
	if len(keys) != 2 {
		t.Fatalf("keys in Redis: %v, want the lock and the counter", keys)
	}
	// Released, locks leave only counters behind: at most one per hash
	// tag, however many keys were locked.
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	const locks = 3000
	for i := range locks {
		l := mustAcquire(t, New(rdb, nil), Key("app:", "idem", strconv.Itoa(i)), Options{TTL: time.Minute})
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	keys = rdb.Keys(ctx, "*").Val()
	for _, k := range keys {
		if !regexp.MustCompile(`^app:\{[0-9a-f]{4}\}fence$`).MatchString(k) {
			t.Fatalf("key %q left after the locks were released", k)
		}
	}
	// 3001 keys over 65,536 tags: about 2,935 distinct counters.
	if len(keys) < 2800 || len(keys) > locks+1 {
		t.Fatalf("%d counters after %d keys, want one per hash tag used", len(keys), locks+1)
	}
}

// The number of counters is bounded by the 65,536 hash tags per prefix,
// not by the keys ever locked: two keys with one tag share one counter.
func TestCountersShareHashTag(t *testing.T) {
	_, rdb := startRedis(t)
	ctx := ctxT(t)
	c := New(rdb, nil)
	a := mustAcquire(t, c, "app:{beef}one", Options{TTL: time.Minute})
	b := mustAcquire(t, c, "app:{beef}two", Options{TTL: time.Minute})
	if b.Fence() <= a.Fence() {
		t.Fatalf("fences %d then %d under one counter", a.Fence(), b.Fence())
	}
	if keys := rdb.Keys(ctx, "app:{beef}fence").Val(); len(keys) != 1 {
		t.Fatalf("counters: %v", keys)
	}
}

func TestRawNamesNotInRedisKeys(t *testing.T) {
	_, rdb := startRedis(t)
	ctx := ctxT(t)
	c := New(rdb, nil)
	const scope, name = "myscope", "customer-secret-Name"
	l := mustAcquire(t, c, Key(DefaultPrefix, scope, name), Options{TTL: time.Minute})
	keys := rdb.Keys(ctx, "*").Val()
	if len(keys) == 0 {
		t.Fatal("no keys in Redis")
	}
	for _, k := range keys {
		for _, raw := range []string{scope, name, strings.ToLower(name)} {
			if strings.Contains(k, raw) {
				t.Fatalf("Redis key %q contains the raw %q", k, raw)
			}
		}
		if !strings.HasPrefix(k, DefaultPrefix+"{") {
			t.Fatalf("Redis key %q is neither a lock nor the counter", k)
		}
	}
	_ = l
}

func TestFenceStrictlyIncreases(t *testing.T) {
	_, rdb := startRedis(t)
	ctx := ctxT(t)
	c := New(rdb, nil)
	key := testKey(t)
	var last int64
	cycle := func(when string) {
		t.Helper()
		l, err := c.Acquire(ctx, key, Options{TTL: time.Minute})
		if err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		if l.Fence() <= last {
			t.Fatalf("%s: fence %d after %d, want strictly larger", when, l.Fence(), last)
		}
		last = l.Fence()
		if err := l.Release(ctx); err != nil {
			t.Fatalf("%s: release: %v", when, err)
		}
	}
	for i := range 200 {
		cycle("cycle " + strconv.Itoa(i))
	}
	// The counter is lost (FLUSHALL, a failover that missed it): the next
	// token, from the Redis clock, is still larger.
	for i := range 5 {
		if err := rdb.Del(ctx, CounterKey(key)).Err(); err != nil {
			t.Fatal(err)
		}
		cycle("after DEL " + strconv.Itoa(i))
		cycle("after DEL, again")
	}
	// One counter for all keys: another key's token is larger still.
	other := mustAcquire(t, c, key+"-other", Options{TTL: time.Minute})
	if other.Fence() <= last {
		t.Fatalf("fence of another key = %d after %d", other.Fence(), last)
	}
}

// A fence from the clock is the Redis TIME in microseconds, its microseconds
// padded to six digits: unpadded, a token issued in the first 100ms of a
// second would be ten times too small. The loop runs until it has seen such
// a token (each second has 100ms of them), with the counter gone each time
// so that the token comes from the clock.
func TestFenceIsTheRedisClock(t *testing.T) {
	_, rdb := startRedis(t)
	ctx := ctxT(t)
	c := New(rdb, nil)
	key := testKey(t)
	micros := func() int64 {
		t.Helper()
		now, err := rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return now.UnixMicro()
	}
	deadline := time.Now().Add(3 * time.Second)
	for small := false; !small; {
		if time.Now().After(deadline) {
			t.Fatal("no token in the first 100ms of a second within 3s")
		}
		if err := rdb.Del(ctx, CounterKey(key)).Err(); err != nil {
			t.Fatal(err)
		}
		before := micros()
		l, err := c.Acquire(ctx, key, Options{TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		after := micros()
		if l.Fence() < before || l.Fence() > after {
			t.Fatalf("fence %d, want the Redis clock between %d and %d", l.Fence(), before, after)
		}
		small = l.Fence()%1_000_000 < 100_000
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// A counter ahead of the Redis clock (tokens issued in the same microsecond,
// the server clock set back, or a counter from an older version that counted
// by INCR) is continued from, never gone below.
func TestFenceContinuesCounterAheadOfClock(t *testing.T) {
	_, rdb := startRedis(t)
	ctx := ctxT(t)
	c := New(rdb, nil)
	key := testKey(t)
	const ahead = 9_000_000_000_000_000 // year 2255 in µs
	fk := CounterKey(key)
	// With a TTL, as if someone had set one: the counter must not keep it.
	if err := rdb.Set(ctx, fk, ahead, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		l := mustAcquire(t, c, key, Options{TTL: time.Minute})
		if want := int64(ahead + i + 1); l.Fence() != want {
			t.Fatalf("cycle %d: fence %d, want %d", i, l.Fence(), want)
		}
		if pttl := rdb.PTTL(ctx, fk).Val(); pttl >= 0 {
			t.Fatalf("cycle %d: counter PTTL %v, want no expiry", i, pttl)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Tokens from the clock are 16 digits: a longer counter is larger, a
	// shorter one (an old INCR counter) is not.
	if err := rdb.Set(ctx, fk, "12345678901234567", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if l := mustAcquire(t, c, key, Options{TTL: time.Minute}); l.Fence() != 12345678901234568 {
		t.Fatalf("after a 17-digit counter: fence %d", l.Fence())
	} else if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// A counter that is not a plain decimal (written by hand, or past
	// int64) is overwritten by the clock's token, not a failure of every
	// acquire.
	for _, bad := range []string{"not-a-number-and-quite-long", "007000000000000000", "123456789012345678901"} {
		if err := rdb.Set(ctx, fk, bad, 0).Err(); err != nil {
			t.Fatal(err)
		}
		l := mustAcquire(t, c, key, Options{TTL: time.Minute})
		if now := time.Now().UnixMicro(); l.Fence() < now-int64(time.Minute/time.Microsecond) || l.Fence() > now+int64(time.Minute/time.Microsecond) {
			t.Fatalf("after counter %q: fence %d, want the Redis clock in µs (about %d)", bad, l.Fence(), now)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := rdb.Set(ctx, fk, 42, 0).Err(); err != nil {
		t.Fatal(err)
	}
	before := time.Now().UnixMicro()
	l := mustAcquire(t, c, key, Options{TTL: time.Minute})
	if l.Fence() < before-int64(time.Minute/time.Microsecond) || l.Fence() > time.Now().UnixMicro()+int64(time.Minute/time.Microsecond) {
		t.Fatalf("after a counter at 42: fence %d, want the Redis clock in µs (about %d)", l.Fence(), before)
	}
	if n, _ := rdb.Get(ctx, fk).Int64(); n != l.Fence() {
		t.Fatalf("counter = %d, want the token issued, %d", n, l.Fence())
	}
}

// A retried acquire (same token; the first reply was lost) succeeds and does
// not issue a second fencing token.
func TestAcquireRetrySameTokenIsIdempotent(t *testing.T) {
	_, rdb := startRedis(t)
	ctx := ctxT(t)
	c := New(rdb, nil)
	key := testKey(t)
	token := uuid.NewString()
	r := c.Backend().(*Redis)
	f1, err := r.TryAcquire(ctx, key, token, time.Minute)
	if err != nil {
		t.Fatalf("first acquire: %v", err)
	}
	f2, err := r.TryAcquire(ctx, key, token, time.Minute)
	if err != nil {
		t.Fatalf("retried acquire: %v", err)
	}
	if f2 != f1 {
		t.Fatalf("retried acquire got fence %d, first %d: a second token was issued", f2, f1)
	}
	if n, _ := rdb.Get(ctx, CounterKey(key)).Int64(); n != f1 {
		t.Fatalf("counter = %d after retry, want %d", n, f1)
	}
	// Another token is still refused.
	if _, err := r.TryAcquire(ctx, key, uuid.NewString(), time.Minute); !errors.Is(err, ErrNotObtained) {
		t.Fatalf("other token: %v, want ErrNotObtained", err)
	}
	// The retry refreshed the lease.
	rdb.PExpire(ctx, key, 5*time.Second)
	if _, err := r.TryAcquire(ctx, key, token, time.Minute); err != nil {
		t.Fatalf("third retry: %v", err)
	}
	if pttl := rdb.PTTL(ctx, key).Val(); pttl < 50*time.Second {
		t.Fatalf("retry did not reset the lease: PTTL %v", pttl)
	}
}

// Checks the retry property on the .lua file itself, as Redis runs it.
func TestAcquireScriptFileRetry(t *testing.T) {
	_, rdb := startRedis(t)
	ctx := ctxT(t)
	src := readScript(t, "../redisscript/take.lua") + readScript(t, "acquire.lua")
	key := testKey(t)
	// run returns the fencing token (a string reply) or the PTTL (an
	// integer reply).
	run := func(token string) (fence string, pttl int64) {
		t.Helper()
		keys := []string{key, CounterKey(key), GoneKey(key, token)}
		res, err := rdb.Eval(ctx, src, keys, token, 60000).Result()
		if err != nil {
			t.Fatal(err)
		}
		switch v := res.(type) {
		case string:
			return v, 0
		case int64:
			return "", v
		}
		t.Fatalf("reply %T %v, want a string or an integer", res, res)
		return "", 0
	}
	tok := uuid.NewString()
	a, _ := run(tok)
	b, _ := run(tok)
	if a == "" || a != b {
		t.Fatalf("same token twice: %q then %q, want the same fencing token twice", a, b)
	}
	if f, pttl := run(uuid.NewString()); f != "" || pttl <= 0 || pttl > 60000 {
		t.Fatalf("other token: fence %q, pttl %d, want the holder's PTTL", f, pttl)
	}
	if err := rdb.Del(ctx, key).Err(); err != nil {
		t.Fatal(err)
	}
	d, _ := run(uuid.NewString())
	an, _ := strconv.ParseInt(a, 10, 64)
	if dn, err := strconv.ParseInt(d, 10, 64); err != nil || dn <= an {
		t.Fatalf("after release: fence %q, want above %s", d, a)
	}
}
