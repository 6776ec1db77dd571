package redislock

// The admin API (/redis_lock/ on Caddy's admin endpoint): the handlers
// listed, a key looked up in every state of its record, an outcome-unknown
// record cleared so that the retry runs, a held lock never touched, handlers
// found by name across reloads, and Redlock.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
	"github.com/reqlock/caddy-redis-lock/internal/redistest"
	"github.com/reqlock/caddy-redis-lock/record"
)

// admin sends an admin API request for a key (query "" for the list) and
// decodes the JSON answer into out when it is not nil.
func (s *caddySite) admin(method, path string, query url.Values, out any) *response {
	s.t.Helper()
	u := s.AdminURL + path
	if query != nil {
		u += "?" + query.Encode()
	}
	r, err := sendRequest(context.Background(), s.client, method, u, "")
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, u, err)
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/json" {
		s.t.Fatalf("%s %s: Content-Type %q, want application/json: %s", method, u, ct, r)
	}
	if out != nil {
		if err := json.Unmarshal([]byte(r.Body), out); err != nil {
			s.t.Fatalf("%s %s: %v: %s", method, u, err, r)
		}
	}
	return r
}

// lookup is GET /redis_lock/keys, expected to answer 200.
func (s *caddySite) lookup(query url.Values) keyState {
	s.t.Helper()
	var st keyState
	if r := s.admin("GET", "/redis_lock/keys", query, &st); r.Status != http.StatusOK {
		s.t.Fatalf("lookup %v: %s", query, r)
	}
	return st
}

func keyQuery(pairs ...string) url.Values {
	q := url.Values{}
	for i := 0; i+1 < len(pairs); i += 2 {
		q.Set(pairs[i], pairs[i+1])
	}
	return q
}

func TestAdminKeys(t *testing.T) {
	t.Parallel()
	srv, rdb := newRedis(t)
	be := chargeBackend(t)
	s := startCaddySite(t, paySite(srv.Addr, be.hostPort(), lockLines("name payments"),
		redisLines("username default", "password secret-of-redis"), storedAnswers("retention 1h")), siteOptions{admin: true})
	// Set after Caddy started: Provision never contacts Redis.
	if err := rdb.ConfigSet(context.Background(), "requirepass", "secret-of-redis").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Do(context.Background(), "auth", "secret-of-redis").Err(); err != nil {
		t.Fatal(err)
	}

	// The list: those four fields, no secrets.
	var list []map[string]any
	r := s.admin("GET", "/redis_lock/", nil, &list)
	want := map[string]any{"name": "payments", "prefix": DefaultPrefix, "mode": ModeStandalone, "idempotency": true}
	if r.Status != 200 || len(list) != 1 || fmt.Sprint(list[0]) != fmt.Sprint(want) {
		t.Fatalf("list: %s", r)
	}

	// A key never seen: 200, state none.
	st := s.lookup(keyQuery("key", "never"))
	if st.RedisKey != defaultKey("never") || st.RecordKey != record.Key(defaultKey("never")) || st.Lock.Held || st.Record == nil || st.Record.State != stateNone {
		t.Fatalf("unknown key: %+v", st)
	}

	// In progress: the lock held with the fencing token the backend got,
	// and DELETE refused, the lock left alone.
	done := make(chan *response, 1)
	go func() { done <- s.do("POST", "/pay/slow", `{}`, "Idempotency-Key", "slow") }()
	entered := be.waitEntered(t, 5*time.Second)
	st = s.lookup(keyQuery("key", "slow", "name", "payments"))
	if !st.Lock.Held || strconv.FormatInt(st.Lock.FencingToken, 10) != entered.Fencing[0] ||
		st.Lock.TTLMs <= 0 || st.Lock.TTLMs > 10_000 || st.Record.State != stateInProgress {
		t.Fatalf("in progress (fencing %v): %+v %+v", entered.Fencing, st.Lock, st.Record)
	}
	if r := s.admin("DELETE", "/redis_lock/keys", keyQuery("key", "slow"), nil); r.Status != http.StatusConflict {
		t.Fatalf("DELETE in progress: %s, want 409", r)
	}
	if !keyExists(t, rdb, defaultKey("slow")) {
		t.Fatal("DELETE removed a held lock")
	}
	first := <-done
	if first.Status != http.StatusOK {
		t.Fatalf("the slow request: %s", first)
	}

	// Completed: its status, body size and retention; the sf-string form
	// of the header names the same key.
	for _, key := range []string{"slow", `"slow"`} {
		st = s.lookup(keyQuery("key", key))
		if st.Key != "slow" || st.RedisKey != defaultKey("slow") || st.Lock.Held || st.Record.State != stateCompleted ||
			st.Record.Status != 200 || *st.Record.BodyBytes != len(first.Body) ||
			st.Record.ExpiresInMs <= 3_500_000 || st.Record.ExpiresInMs > 3_600_000 {
			t.Fatalf("completed, key %s: %+v %+v", key, st, st.Record)
		}
	}
	if r := s.admin("GET", "/redis_lock/keys", keyQuery("key", `"unterminated`), nil); r.Status != http.StatusBadRequest {
		t.Fatalf("an invalid sf-string: %s, want 400", r)
	}

	// Not replayable: status only.
	s.do("POST", "/pay/big", `{}`, "Idempotency-Key", "big")
	if st = s.lookup(keyQuery("key", "big")); st.Record.State != stateNotReplayable || st.Record.Status != 200 || *st.Record.BodyBytes != 0 {
		t.Fatalf("not replayable: %+v", st.Record)
	}

	// Outcome unknown, cleared by the operator: the retry runs.
	expectProblem(t, s.do("POST", "/pay/hang", `{}`, "Idempotency-Key", "unknown"), http.StatusBadGateway)
	if st = s.lookup(keyQuery("key", "unknown")); st.Record.State != stateOutcomeUnknown || st.Record.Status != http.StatusBadGateway {
		t.Fatalf("outcome unknown: %+v", st.Record)
	}
	t.Logf("outcome unknown: %s", s.admin("GET", "/redis_lock/keys", keyQuery("key", "unknown", "name", "payments"), nil).Body)
	if r := s.do("POST", "/pay/hang", `{}`, "Idempotency-Key", "unknown"); r.Header.Get(replayedHeader) != "true" {
		t.Fatalf("before the DELETE, a retry: %s, want the stored problem", r)
	}
	var removed map[string]string
	if r := s.admin("DELETE", "/redis_lock/keys", keyQuery("key", "unknown"), &removed); r.Status != 200 ||
		removed["removed"] != record.Key(defaultKey("unknown")) || removed["state"] != stateOutcomeUnknown {
		t.Fatalf("DELETE: %s", r)
	}
	if st = s.lookup(keyQuery("key", "unknown")); st.Record.State != stateNone {
		t.Fatalf("after the DELETE: %+v", st.Record)
	}
	if r := s.do("POST", "/pay", `{}`, "Idempotency-Key", "unknown"); r.Status != http.StatusCreated || r.Header.Get(replayedHeader) != "" {
		t.Fatalf("after the DELETE, a retry: %s, want it run", r)
	}
	if n := be.executions("unknown"); n != 2 {
		t.Fatalf("the backend ran %d times, want twice (once before the DELETE, once after)", n)
	}

	// A record this version cannot read: shown, and removable.
	if err := rdb.Set(context.Background(), record.Key(defaultKey("garbled")), "not a record", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	if st = s.lookup(keyQuery("key", "garbled")); st.Record.State != stateUnreadable || st.Record.ExpiresInMs <= 0 {
		t.Fatalf("an unreadable record: %+v", st.Record)
	}
	if r := s.admin("DELETE", "/redis_lock/keys", keyQuery("key", "garbled"), &removed); r.Status != 200 || removed["state"] != stateUnreadable {
		t.Fatalf("DELETE of an unreadable record: %s", r)
	}

	// A bare header value with quotes inside is a key as it is.
	if st = s.lookup(keyQuery("key", `x:"y"`)); st.Key != `x:"y"` {
		t.Errorf("a bare value with quotes: %+v", st)
	}

	// Errors, in Caddy's admin API form.
	for _, c := range []struct {
		method string
		query  url.Values
		status int
	}{
		{"DELETE", keyQuery("key", "never"), http.StatusNotFound},
		{"GET", keyQuery("key", "x", "name", "other"), http.StatusNotFound},
		{"GET", keyQuery("scope", "x"), http.StatusBadRequest},
		{"GET", keyQuery("key", "x", "scope", "y"), http.StatusBadRequest}, // no scope in this handler
		{"GET", url.Values{"key": {"a", "b"}}, http.StatusBadRequest},
		{"POST", keyQuery("key", "x"), http.StatusMethodNotAllowed},
	} {
		var e struct{ Error string }
		if r := s.admin(c.method, "/redis_lock/keys", c.query, &e); r.Status != c.status || e.Error == "" {
			t.Errorf("%s %v: %s, want %d with an error", c.method, c.query, r, c.status)
		}
	}
}

// Several handlers: found by name, a lock without idempotency has no
// record, a scope is part of the key; names are unique in a config, copies
// of one handler (a snippet) are one; a reload, and a reload that fails,
// leave the admin API on the config that runs.
func TestAdminNamesAndReload(t *testing.T) {
	t.Parallel()
	srv, rdb := newRedis(t)
	be := newRecorder(t, nil)
	site := func(name, prefix string) string {
		return fmt.Sprintf("\tredis_lock {http.request.header.X-Test-Key} {\n\t\tname %s\n\t\tprefix %s\n\t\tscope {http.request.header.X-Tenant}\n\t\tmissing_key pass\n\t\tredis %s\n\t}\n\treverse_proxy %s",
			name, prefix, srv.Addr, be.hostPort())
	}
	sites := startCaddySites(t, siteOptions{admin: true},
		site("orders", "orders:"),
		paySite(srv.Addr, be.hostPort(), lockLines("name payments"), idempotent()))
	s := sites[0]

	var list []handlerInfo
	s.admin("GET", "/redis_lock/", nil, &list)
	if len(list) != 2 || list[0].Name != "orders" || list[0].Idempotency || list[1].Name != "payments" || !list[1].Idempotency {
		t.Fatalf("list: %+v", list)
	}
	if r := s.admin("GET", "/redis_lock/keys", keyQuery("key", "k"), nil); r.Status != http.StatusBadRequest || !strings.Contains(r.Body, `\"orders\"`) {
		t.Fatalf("no name with two handlers: %s, want 400 naming them", r)
	}

	// A lock without idempotency: held, with its token; no record; DELETE
	// never removes it.
	rkey := engine.Key("orders:", "acme", "o-1")
	holdLock(t, rdb, rkey, 10*time.Second)
	if err := rdb.HSet(context.Background(), rkey, "another-node", "1234").Err(); err != nil {
		t.Fatal(err)
	}
	st := s.lookup(keyQuery("key", "o-1", "scope", "acme", "name", "orders"))
	if st.RedisKey != rkey || !st.Lock.Held || st.Lock.FencingToken != 1234 || st.Record != nil || st.RecordKey != "" {
		t.Fatalf("held lock: %s %+v", rkey, st)
	}
	if st = s.lookup(keyQuery("key", "o-1", "scope", "other", "name", "orders")); st.Lock.Held {
		t.Fatalf("another scope is another key: %+v", st)
	}
	// A handler with a scope needs one: without, no request has the key.
	if r := s.admin("GET", "/redis_lock/keys", keyQuery("key", "o-1", "name", "orders"), nil); r.Status != http.StatusBadRequest {
		t.Fatalf("no scope for a scoped handler: %s, want 400", r)
	}
	if r := s.admin("DELETE", "/redis_lock/keys", keyQuery("key", "o-1", "scope", "acme", "name", "orders"), nil); r.Status != http.StatusConflict || !keyExists(t, rdb, rkey) {
		t.Fatalf("DELETE of a held lock: %s", r)
	}
	if r := s.admin("DELETE", "/redis_lock/keys", keyQuery("key", "o-2", "scope", "acme", "name", "orders"), nil); r.Status != http.StatusNotFound {
		t.Fatalf("DELETE of a free lock: %s, want 404", r)
	}

	// A config whose names clash fails to load, and the admin API stays on
	// the running one.
	clash := strings.Replace(s.caddyfile, "name payments", "name orders", 1)
	if err := loadCaddyfileErr(clash); err == nil || !strings.Contains(err.Error(), `name "orders"`) {
		t.Fatalf("two handlers named orders: %v", err)
	}
	s.admin("GET", "/redis_lock/", nil, &list)
	if len(list) != 2 || list[0].Name != "orders" || list[1].Name != "payments" {
		t.Fatalf("after a failed load: %+v", list)
	}

	// A snippet imported into two sites: one name, one handler.
	snippet := "(orders) {\n" + site("orders", "orders:") + "\n}\n"
	copies := strings.Replace(s.caddyfile, "\n"+site("orders", "orders:"), "\n\timport orders", 1)
	copies = strings.Replace(copies, "\n"+paySite(srv.Addr, be.hostPort(), lockLines("name payments"), idempotent()), "\n\timport orders", 1)
	copies = snippet + copies
	s.caddyfile = copies
	s.reload()
	s.admin("GET", "/redis_lock/", nil, &list)
	if len(list) != 1 || list[0].Name != "orders" {
		t.Fatalf("a snippet in two sites: %+v\n%s", list, copies)
	}
	if st = s.lookup(keyQuery("key", "o-1", "scope", "acme")); !st.Lock.Held {
		t.Fatalf("the only handler, by no name: %+v", st)
	}
	if r := s.admin("GET", "/redis_lock/keys", keyQuery("key", "k", "name", "payments"), nil); r.Status != http.StatusNotFound {
		t.Fatalf("a name the reload removed: %s, want 404", r)
	}
}

// During a reload the admin API answers for the config that runs until the
// new one has started: queried while the new config's redis_lock handler is
// provisioned and a later module still provisions, it shows the old one.
func TestAdminReloadOverlap(t *testing.T) {
	t.Parallel()
	srv, _ := newRedis(t)
	be := newRecorder(t, nil)
	site := func(name string, gate bool) string {
		g := ""
		if gate {
			g = "\n\t\ttest_provision_gate"
		}
		return fmt.Sprintf("\troute {\n\t\tredis_lock {http.request.header.X-Test-Key} {\n\t\t\tname %s\n\t\t\tredis %s\n\t\t}%s\n\t\treverse_proxy %s\n\t}",
			name, srv.Addr, g, be.hostPort())
	}
	s := startCaddySite(t, site("old", false), siteOptions{admin: true})
	names := func() string {
		var list []handlerInfo
		var last error
		for range 50 { // the admin server is replaced at the start of a load
			r, err := sendRequest(context.Background(), s.client, "GET", s.AdminURL+"/redis_lock/", "")
			if err == nil && r.Status == 200 && json.Unmarshal([]byte(r.Body), &list) == nil {
				var out []string
				for _, h := range list {
					out = append(out, h.Name)
				}
				return strings.Join(out, ",")
			}
			last = err
			s.client.CloseIdleConnections()
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatalf("GET /redis_lock/: %v", last)
		return ""
	}

	provisionGate.entered, provisionGate.release = make(chan struct{}), make(chan struct{})
	t.Cleanup(func() { provisionGate.entered, provisionGate.release = nil, nil })
	newCf := strings.Replace(s.caddyfile, site("old", false), site("new", true), 1)
	loaded := make(chan error, 1)
	go func() { loaded <- loadCaddyfileErr(newCf) }()
	select {
	case <-provisionGate.entered:
	case err := <-loaded:
		t.Fatalf("the new config loaded without its gate: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the new config's gate was never provisioned")
	}
	if got := names(); got != "old" {
		t.Errorf("while the new config provisions: %q, want the old handler alone", got)
	}
	close(provisionGate.release)
	if err := <-loaded; err != nil {
		t.Fatal(err)
	}
	if got := names(); got != "new" {
		t.Errorf("after the reload: %q, want the new handler alone", got)
	}
	s.caddyfile = newCf
}

// provisionGate holds the Provision of test_provision_gate modules: entered
// is closed when one begins, which then waits until release is closed.
var provisionGate struct{ entered, release chan struct{} }

// gateHandler is test_provision_gate: a handler that passes requests on,
// whose Provision waits on provisionGate.
type gateHandler struct{}

func (gateHandler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.test_provision_gate", New: func() caddy.Module { return new(gateHandler) }}
}

func (gateHandler) Provision(caddy.Context) error {
	if provisionGate.entered != nil {
		close(provisionGate.entered)
		<-provisionGate.release
	}
	return nil
}

func (gateHandler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	return next.ServeHTTP(w, r)
}

func init() {
	caddy.RegisterModule(gateHandler{})
	httpcaddyfile.RegisterHandlerDirective("test_provision_gate", func(httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
		return gateHandler{}, nil
	})
}

// Redlock: a master's own answer beside the majority's, a record removed
// from every master.
func TestAdminRedlock(t *testing.T) {
	t.Parallel()
	srvs := make([]*redistest.Server, 3)
	addrs := make([]string, 3)
	for i := range srvs {
		srvs[i] = redistest.Start(t)
		addrs[i] = srvs[i].Addr
	}
	be := chargeBackend(t)
	body := strings.Replace(paySite(addrs[0], be.hostPort(), storedAnswers()),
		"redis "+addrs[0], "redis {\n\t\t\tmode redlock\n\t\t\taddress "+strings.Join(addrs, " ")+"\n\t\t\ttimeout 300ms\n\t\t}", 1)
	s := startCaddySite(t, body, siteOptions{admin: true})

	done := make(chan *response, 1)
	go func() { done <- s.do("POST", "/pay/slow", `{}`, "Idempotency-Key", "rl") }()
	entered := be.waitEntered(t, 5*time.Second)
	st := s.lookup(keyQuery("key", "rl"))
	if !st.Lock.Held || st.Record.State != stateInProgress || len(st.Nodes) != 3 {
		t.Fatalf("in progress: %+v", st)
	}
	// The holder's token is the largest of the majority that granted the
	// lock first: one of the masters' tokens, at most the one shown.
	fence, _ := strconv.ParseInt(entered.Fencing[0], 10, 64)
	mastersHave := false
	for _, n := range st.Nodes {
		mastersHave = mastersHave || (n.Lock.Held && n.Lock.FencingToken == fence && n.Record.State == stateInProgress)
	}
	if !mastersHave || fence > st.Lock.FencingToken {
		t.Fatalf("the backend's fencing token %d, the masters': %+v %+v %+v, shown %d", fence, *st.Nodes[0].Lock, *st.Nodes[1].Lock, *st.Nodes[2].Lock, st.Lock.FencingToken)
	}
	if r := s.admin("DELETE", "/redis_lock/keys", keyQuery("key", "rl"), nil); r.Status != http.StatusConflict {
		t.Fatalf("DELETE in progress: %s", r)
	}
	<-done

	// One master down: the majority's answer, and the master's error.
	srvs[2].Stop()
	st = s.lookup(keyQuery("key", "rl"))
	if st.Lock.Held || st.Record.State != stateCompleted || st.Nodes[2].Error == "" || st.Nodes[0].Record.State != stateCompleted {
		t.Fatalf("completed, a master down: %+v", st)
	}
	if r := s.admin("DELETE", "/redis_lock/keys", keyQuery("key", "rl"), nil); r.Status != http.StatusServiceUnavailable {
		t.Fatalf("DELETE with a master down: %s, want 503 (the record may be left there)", r)
	}
	if err := srvs[2].Restart(); err != nil {
		t.Fatal(err)
	}
	var removed map[string]string
	if r := s.admin("DELETE", "/redis_lock/keys", keyQuery("key", "rl"), &removed); r.Status != 200 || removed["state"] != stateCompleted {
		t.Fatalf("DELETE: %s", r)
	}
	st = s.lookup(keyQuery("key", "rl"))
	for _, n := range st.Nodes {
		if n.Error != "" || n.Record.State != stateNone {
			t.Fatalf("after the DELETE: %+v", st.Nodes)
		}
	}
	if r := s.do("POST", "/pay", `{}`, "Idempotency-Key", "rl"); r.Status != http.StatusCreated || be.executions("rl") != 2 {
		t.Fatalf("the retry after the DELETE: %s, %d runs", r, be.executions("rl"))
	}
}

// Sentinel and Cluster: the scripts run on the primary, or on the master of
// the key's slot.
func TestAdminTopologies(t *testing.T) {
	t.Parallel()
	t.Run("sentinel", func(t *testing.T) {
		sn := redistest.StartSentinel(t)
		redisBlock := fmt.Sprintf("redis {\n\t\t\tmode sentinel\n\t\t\tmaster_name %s\n\t\t\taddress %s\n\t\t}",
			sn.MasterName(), strings.Join(sn.SentinelAddrs(), " "))
		adminRoundTrips(t, ModeSentinel, redisBlock, func(string) (string, error) {
			return sn.MasterAddr(context.Background())
		})
	})
	t.Run("cluster", func(t *testing.T) {
		c := redistest.StartCluster(t, 3, 0)
		redisBlock := "redis {\n\t\t\tmode cluster\n\t\t\taddress " + c.MasterAddrs()[0] + "\n\t\t}"
		adminRoundTrips(t, ModeCluster, redisBlock, func(key string) (string, error) {
			return c.MasterForKey(context.Background(), key)
		})
	})
}

// adminRoundTrips runs 8 keys through a site on redisBlock: each answered,
// looked up as completed, removed, and run again.
func adminRoundTrips(t *testing.T, mode, redisBlock string, masterOf func(key string) (string, error)) {
	be := chargeBackend(t)
	body := strings.Replace(paySite("ADDR", be.hostPort(), idempotent()), "redis ADDR", redisBlock, 1)
	s := startCaddySite(t, body, siteOptions{admin: true})
	var list []handlerInfo
	if s.admin("GET", "/redis_lock/", nil, &list); len(list) != 1 || list[0].Mode != mode {
		t.Fatalf("list: %+v", list)
	}
	masters := map[string]bool{}
	for k := range 8 {
		key := fmt.Sprintf("admin-%s-%d", mode, k)
		if r := s.do("POST", "/pay", `{}`, "Idempotency-Key", key); r.Status != http.StatusCreated {
			t.Fatalf("%s: %s", key, r)
		}
		m, err := masterOf(defaultKey(key))
		if err != nil {
			t.Fatal(err)
		}
		masters[m] = true
		if st := s.lookup(keyQuery("key", key)); st.Record.State != stateCompleted || st.Record.Status != http.StatusCreated {
			t.Fatalf("%s on %s: %+v", key, m, st.Record)
		}
		if r := s.admin("DELETE", "/redis_lock/keys", keyQuery("key", key), nil); r.Status != http.StatusOK {
			t.Fatalf("DELETE %s: %s", key, r)
		}
		if r := s.do("POST", "/pay", `{}`, "Idempotency-Key", key); r.Status != http.StatusCreated || r.Header.Get(replayedHeader) != "" {
			t.Fatalf("%s after the DELETE: %s, want it run", key, r)
		}
	}
	if (mode == ModeCluster && len(masters) < 2) || be.executions() != 16 {
		t.Fatalf("keys on %d masters, %d runs; want 16 runs (and more than one master in a Cluster)", len(masters), be.executions())
	}
}
