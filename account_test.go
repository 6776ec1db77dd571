package redislock

// Per-account serialisation (`idempotency { key }`): the handler's key is an
// account, under which one request runs at a time, whatever its
// Idempotency-Key; the record is per idempotency key within the account.
// Through Caddy, on a standalone Redis, a Cluster (the account's lock and
// the record in different slots) and Redlock.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

// accountBackend is a payment API keeping balances: it charges every
// request it gets (X-Hold-Ms long), and records, per account (X-Account),
// the requests that ran at once and the fencing tokens in the order the
// requests came.
type accountBackend struct {
	addr     string
	mu       sync.Mutex
	inflight map[string]int
	overlaps map[string]int
	charges  map[string]int // by account + "/" + Idempotency-Key
	fences   map[string][]int64
	n        int
	entered  chan string
}

func newAccountBackend(t *testing.T) *accountBackend {
	t.Helper()
	b := &accountBackend{inflight: map[string]int{}, overlaps: map[string]int{}, charges: map[string]int{},
		fences: map[string][]int64{}, entered: make(chan string, 64)}
	srv := httptest.NewServer(http.HandlerFunc(b.serve))
	t.Cleanup(srv.Close)
	b.addr = strings.TrimPrefix(srv.URL, "http://")
	return b
}

func (b *accountBackend) serve(w http.ResponseWriter, r *http.Request) {
	acct, key := r.Header.Get("X-Account"), r.Header.Get("Idempotency-Key")
	fence, _ := strconv.ParseInt(r.Header.Get("Fencing-Token"), 10, 64)
	b.mu.Lock()
	b.n++
	id := b.n
	b.inflight[acct]++
	if b.inflight[acct] > 1 {
		b.overlaps[acct]++
	}
	b.charges[acct+"/"+key]++
	b.fences[acct] = append(b.fences[acct], fence)
	b.mu.Unlock()
	select {
	case b.entered <- acct + "/" + key:
	default:
	}
	hold, _ := strconv.Atoi(r.Header.Get("X-Hold-Ms"))
	time.Sleep(time.Duration(hold) * time.Millisecond)
	b.mu.Lock()
	b.inflight[acct]--
	b.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"charge":%d,"account":%q,"key":%q}`, id, acct, key)
}

func (b *accountBackend) count(acct, key string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.charges[acct+"/"+key]
}

func (b *accountBackend) waitEntered(t *testing.T, want string) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case got := <-b.entered:
			if got == want {
				return
			}
		case <-deadline:
			t.Fatalf("%s never reached the backend", want)
		}
	}
}

// accountSite has three routes on the account in X-Account: /pay (no
// wait), /wait (wait 5s) and /open (missing_key pass: a request without an
// Idempotency-Key runs under the account's lock alone). Each compares a
// retry's JSON body by value.
func accountSite(redis, backend string) string {
	route := func(path, extra string) string {
		return fmt.Sprintf(`	handle %s* {
		redis_lock {http.request.header.X-Account} {
			%s
			%s
			idempotency {
				key {http.request.header.Idempotency-Key}
				fingerprint method path json
			}
		}
		reverse_proxy %s
	}
`, path, redis, extra, backend)
	}
	return route("/pay", "name pay") + route("/wait", "name wait\n\t\t\tprefix w:\n\t\t\twait 5s") +
		route("/open", "name open\n\t\t\tprefix o:\n\t\t\tmissing_key pass")
}

// problemCode is the problem's code (its slug) in r's body; "" for none.
func problemCode(r *response) string {
	var p problemJSON
	_ = json.Unmarshal([]byte(r.Body), &p)
	return p.Error.Code
}

func TestAccountSerialisation(t *testing.T) {
	t.Parallel()
	topologies := []struct {
		name  string
		redis func(t *testing.T) string
	}{
		{"standalone", func(t *testing.T) string { return "redis " + redistest.Start(t).Addr }},
		{"cluster", func(t *testing.T) string {
			c := redistest.StartCluster(t, 3, 0)
			return "redis {\n\t\t\t\tmode cluster\n\t\t\t\taddress " + strings.Join(c.MasterAddrs(), " ") + "\n\t\t\t}"
		}},
		{"redlock", func(t *testing.T) string {
			addrs := make([]string, 3)
			for i := range addrs {
				addrs[i] = redistest.Start(t).Addr
			}
			return "redis {\n\t\t\t\tmode redlock\n\t\t\t\taddress " + strings.Join(addrs, " ") + "\n\t\t\t}"
		}},
	}
	for _, tp := range topologies {
		t.Run(tp.name, func(t *testing.T) {
			t.Parallel()
			be := newAccountBackend(t)
			s := startCaddySite(t, accountSite(tp.redis(t), be.addr), siteOptions{admin: true})
			checkAccountConflicts(t, s, be)
			checkReplayWhileAccountBusy(t, s, be)
			checkAccountWait(t, s, be)
			checkAccountMissingKey(t, s, be)
			checkJSONFingerprint(t, s, be)
			be.mu.Lock()
			defer be.mu.Unlock()
			for acct, n := range be.overlaps {
				if n > 0 {
					t.Errorf("account %s: %d requests ran beside another of the account", acct, n)
				}
			}
		})
	}
}

// pay sends a charge on route path for acct under key ("" for none),
// which the backend holds for hold.
func pay(s *caddySite, path, acct, key string, hold time.Duration) *response {
	s.t.Helper()
	return payBody(s, path, acct, key, hold, `{"amount":1299}`)
}

// payBody is pay with its JSON body.
func payBody(s *caddySite, path, acct, key string, hold time.Duration, body string) *response {
	s.t.Helper()
	hdr := []string{"X-Account", acct, "X-Hold-Ms", strconv.Itoa(int(hold / time.Millisecond))}
	if key != "" {
		hdr = append(hdr, "Idempotency-Key", key)
	}
	r, err := s.send(context.Background(), "POST", path, body, hdr...)
	if err != nil {
		s.t.Errorf("POST %s %s/%s: %v", path, acct, key, err)
		return &response{}
	}
	return r
}

// Another request of a busy account is refused (409 conflict), and its
// record given back, so that its retry runs; a duplicate of the request in
// progress is 409 in-progress; another account with the same idempotency
// key never meets it; once done, a retry is replayed.
func checkAccountConflicts(t *testing.T, s *caddySite, be *accountBackend) {
	first := make(chan *response, 1)
	go func() { first <- pay(s, "/pay", "a", "k1", 800*time.Millisecond) }()
	be.waitEntered(t, "a/k1")

	if r := pay(s, "/pay", "a", "k2", 0); r.Status != http.StatusConflict || problemCode(r) != "conflict" || r.Header.Get("Retry-After") == "" {
		t.Fatalf("another key on the busy account: %s, want 409 conflict with Retry-After", r)
	}
	if r := pay(s, "/pay", "a", "k1", 0); r.Status != http.StatusConflict || problemCode(r) != "in-progress" {
		t.Fatalf("a duplicate of the request in progress: %s, want 409 in-progress", r)
	}
	if r := pay(s, "/pay", "b", "k1", 0); r.Status != http.StatusCreated || !strings.Contains(r.Body, `"account":"b"`) {
		t.Fatalf("the same idempotency key on another account: %s, want its own charge", r)
	}
	st := s.lookup(keyQuery("name", "pay", "key", "a", "idempotency_key", "k1"))
	if !st.Lock.Held || st.Record.State != stateInProgress || st.AccountLock == nil || !st.AccountLock.Held || st.IdempotencyKey != "k1" {
		t.Fatalf("admin lookup of a/k1 in progress: %+v", st)
	}
	r1 := <-first
	if r1.Status != http.StatusCreated {
		t.Fatalf("the first charge: %s", r1)
	}
	if r := pay(s, "/pay", "a", "k2", 0); r.Status != http.StatusCreated {
		t.Fatalf("the refused request's retry once the account is free: %s, want it to run", r)
	}
	again := pay(s, "/pay", "a", "k1", 0)
	if again.Status != http.StatusCreated || again.Body != r1.Body || again.Header.Get(replayedHeader) != "true" {
		t.Fatalf("a retry of the finished request: %s, want the first answer replayed", again)
	}
	for key, want := range map[string]int{"a/k1": 1, "a/k2": 1, "b/k1": 1} {
		acct, k, _ := strings.Cut(key, "/")
		if n := be.count(acct, k); n != want {
			t.Errorf("%s charged %d times, want %d", key, n, want)
		}
	}
	st = s.lookup(keyQuery("name", "pay", "key", "a", "idempotency_key", "k1"))
	if st.Lock.Held || st.Record.State != stateCompleted || st.AccountLock == nil || st.AccountLock.Held {
		t.Fatalf("admin lookup of a/k1 done: %+v", st)
	}
	if r := s.admin("DELETE", "/redis_lock/keys", keyQuery("name", "pay", "key", "a"), nil); r.Status != http.StatusBadRequest {
		t.Fatalf("DELETE without idempotency_key: %s, want 400", r)
	}
}

// A retry of a finished request is replayed while another request of the
// account holds its lock: a replay never takes it.
func checkReplayWhileAccountBusy(t *testing.T, s *caddySite, be *accountBackend) {
	busy := make(chan *response, 1)
	go func() { busy <- pay(s, "/pay", "a", "k3", time.Second) }()
	be.waitEntered(t, "a/k3")
	if st := s.lookup(keyQuery("name", "pay", "key", "a")); !st.Lock.Held || st.Record != nil {
		t.Fatalf("admin lookup of account a while k3 runs: %+v, want its lock held", st)
	}
	r := pay(s, "/pay", "a", "k1", 0)
	select {
	case b := <-busy:
		t.Fatalf("k3 finished (%s) before the replay was answered", b)
	default:
	}
	if r.Status != http.StatusCreated || r.Header.Get(replayedHeader) != "true" {
		t.Fatalf("a replay while the account is busy: %s", r)
	}
	if b := <-busy; b.Status != http.StatusCreated {
		t.Fatalf("k3: %s", b)
	}
}

// With wait, requests of one account with distinct keys run one after
// another, each with a larger fencing token (the account lock's).
func checkAccountWait(t *testing.T, s *caddySite, be *accountBackend) {
	const n = 5
	var wg sync.WaitGroup
	results := make([]*response, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = pay(s, "/wait", "c", fmt.Sprintf("w%d", i), 150*time.Millisecond)
		}()
	}
	wg.Wait()
	for i, r := range results {
		if r.Status != http.StatusCreated {
			t.Fatalf("wait, request %d: %s", i, r)
		}
	}
	be.mu.Lock()
	fences := append([]int64(nil), be.fences["c"]...)
	be.mu.Unlock()
	if len(fences) != n {
		t.Fatalf("account c: %d charges, want %d", len(fences), n)
	}
	for i := 1; i < n; i++ {
		if fences[i] <= fences[i-1] {
			t.Fatalf("account c's fencing tokens in arrival order: %v, want increasing", fences)
		}
	}
}

// A request without an Idempotency-Key: 400 missing-key, or with
// missing_key pass, run under the account's lock alone.
func checkAccountMissingKey(t *testing.T, s *caddySite, be *accountBackend) {
	if r := pay(s, "/pay", "d", "", 0); r.Status != http.StatusBadRequest || problemCode(r) != "missing-key" {
		t.Fatalf("no Idempotency-Key: %s, want 400 missing-key", r)
	}
	first := make(chan *response, 1)
	go func() { first <- pay(s, "/open", "d", "", 600*time.Millisecond) }()
	be.waitEntered(t, "d/")
	if r := pay(s, "/open", "d", "", 0); r.Status != http.StatusConflict || problemCode(r) != "conflict" {
		t.Fatalf("a keyless request beside another of the account: %s, want 409 conflict", r)
	}
	if r := <-first; r.Status != http.StatusCreated {
		t.Fatalf("the keyless request: %s", r)
	}
	if r := pay(s, "/open", "d", "", 0); r.Status != http.StatusCreated || r.Header.Get(replayedHeader) != "" {
		t.Fatalf("the next keyless request: %s, want it to run (no record)", r)
	}
}

// fingerprint ... json: a retry that re-serialises its body (members in
// another order, a number written another way) is the same request and is
// replayed; another value is 422 key-reused; a body that is not JSON is
// 400 invalid-json, and reaches nothing.
func checkJSONFingerprint(t *testing.T, s *caddySite, be *accountBackend) {
	first := payBody(s, "/pay", "e", "j1", 0, `{"amount":1299,"currency":"eur","items":[{"sku":"a","qty":1}]}`)
	if first.Status != http.StatusCreated {
		t.Fatalf("json fingerprint, first: %s", first)
	}
	again := payBody(s, "/pay", "e", "j1", 0, "{ \"items\": [ {\"qty\": 1.0, \"sku\": \"a\"} ],\n \"currency\": \"eur\", \"amount\": 1.299e3 }")
	if again.Body != first.Body || again.Header.Get(replayedHeader) != "true" {
		t.Fatalf("json fingerprint, the body re-serialised: %s, want %q replayed", again, first.Body)
	}
	if r := payBody(s, "/pay", "e", "j1", 0, `{"amount":1300,"currency":"eur","items":[{"sku":"a","qty":1}]}`); r.Status != http.StatusUnprocessableEntity || problemCode(r) != "key-reused" {
		t.Fatalf("json fingerprint, another amount: %s, want 422 key-reused", r)
	}
	if r := payBody(s, "/pay", "e", "j2", 0, `amount=1299`); r.Status != http.StatusBadRequest || problemCode(r) != "invalid-json" {
		t.Fatalf("json fingerprint, a form body: %s, want 400 invalid-json", r)
	}
	if n, m := be.count("e", "j1"), be.count("e", "j2"); n != 1 || m != 0 {
		t.Fatalf("json fingerprint: j1 charged %d times, j2 %d; want 1 and 0", n, m)
	}
}

// The README's wallet recipe, as written there: two payments of one
// account (its id in the JSON body) with their own keys run one after the
// other, and a retry of the first is replayed.
func TestWalletRecipe(t *testing.T) {
	t.Parallel()
	srv, _ := newRedis(t)
	be := newAccountBackend(t)
	s := startCaddySite(t, readmeRecipe(t, "### A wallet", srv.Addr, be.addr,
		"{http.redis_lock.json.account_id}", "key {http.request.header.Idempotency-Key}"), siteOptions{})
	charge := func(key string) *response {
		r, err := s.send(context.Background(), "POST", "/wallet/pay", `{"account_id":"acct_1","amount":500}`,
			"Idempotency-Key", key, "X-Account", "acct_1", "X-Hold-Ms", "300")
		if err != nil {
			t.Error(err)
			return &response{}
		}
		return r
	}
	var wg sync.WaitGroup
	results := make([]*response, 2)
	for i, key := range []string{"pay-1", "pay-2"} {
		wg.Add(1)
		go func() { defer wg.Done(); results[i] = charge(key) }()
	}
	wg.Wait()
	for i, r := range results {
		if r.Status != http.StatusCreated {
			t.Fatalf("payment %d: %s", i+1, r)
		}
	}
	if again := charge("pay-1"); again.Body != results[0].Body || again.Header.Get(replayedHeader) != "true" {
		t.Fatalf("a retry of pay-1: %s, want %q replayed", again, results[0].Body)
	}
	be.mu.Lock()
	defer be.mu.Unlock()
	if be.overlaps["acct_1"] != 0 || be.charges["acct_1/pay-1"] != 1 || be.charges["acct_1/pay-2"] != 1 {
		t.Fatalf("overlaps %d, charges %v; want none and one each", be.overlaps["acct_1"], be.charges)
	}
}

// Either lock of a per-account request lost while it runs (the account's,
// or its record's) cancels the upstream request; the client gets 502
// outcome-unknown at once, and so does its retry, from the record: the
// backend ran once. A legacy backend goes on charging after the
// cancellation: with the record's lock lost and the account's still held,
// the account's lock is left to its lease, and another request of the
// account is refused meanwhile.
func TestAccountLostLock(t *testing.T) {
	t.Parallel()
	srv, rdb := newRedis(t)
	var mu sync.Mutex
	runs := map[string]int{}
	cancelled := make(chan string, 4)
	entered := make(chan string, 4)
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		_, _ = io.ReadAll(r.Body) // then the server watches the connection
		mu.Lock()
		runs[key]++
		mu.Unlock()
		entered <- key
		select {
		case <-r.Context().Done():
			cancelled <- key
			time.Sleep(time.Second) // the charge goes on
		case <-time.After(10 * time.Second):
		}
	}))
	t.Cleanup(be.Close)
	s := startCaddySite(t, fmt.Sprintf(`	redis_lock {http.request.header.X-Account} {
		redis %s
		ttl 3s
		renew 100ms
		idempotency {
			key {http.request.header.Idempotency-Key}
		}
	}
	reverse_proxy %s`, srv.Addr, strings.TrimPrefix(be.URL, "http://")), siteOptions{})

	account := engine.Key(engine.DefaultPrefix, "", "a")
	for _, c := range []struct{ key, lost string }{
		{"k-account", account},
		{"k-record", engine.Key(engine.DefaultPrefix, account, "k-record")},
	} {
		done := make(chan *response, 1)
		go func() {
			r, err := s.send(context.Background(), "POST", "/pay", `{}`, "X-Account", "a", "Idempotency-Key", c.key)
			if err != nil {
				t.Error(err)
			}
			done <- r
		}()
		if got := <-entered; got != c.key {
			t.Fatalf("%s: the backend got %s", c.key, got)
		}
		lost := time.Now()
		if n, err := rdb.Del(context.Background(), c.lost).Result(); err != nil || n != 1 {
			t.Fatalf("%s: DEL %s = %d, %v; keys %v", c.key, c.lost, n, err, rdb.Keys(context.Background(), "*").Val())
		}
		select {
		case <-cancelled:
		case <-time.After(3 * time.Second):
			t.Fatalf("%s: the upstream request was not cancelled after its lock was lost", c.key)
		}
		first := <-done
		if p := expectProblem(t, first, http.StatusBadGateway); !strings.HasSuffix(p.Type, "#outcome-unknown") || time.Since(lost) > 2*time.Second {
			t.Fatalf("%s: %s after %v, want outcome-unknown within a few renewals", c.key, first, time.Since(lost))
		}
		var again *response
		redistest.Eventually(t, 5*time.Second, "the stored outcome", func() bool {
			again = s.do("POST", "/pay", `{}`, "X-Account", "a", "Idempotency-Key", c.key)
			return again.Status != http.StatusConflict
		})
		if again.Status != http.StatusBadGateway || again.Header.Get(replayedHeader) != "true" {
			t.Fatalf("%s: the retry got %s, want the stored outcome-unknown", c.key, again)
		}
		if c.key == "k-record" {
			if r := s.do("POST", "/pay", `{}`, "X-Account", "a", "Idempotency-Key", "k-other"); r.Status != http.StatusConflict || problemCode(r) != "conflict" {
				t.Fatalf("another request of the account while the cancelled one may still run: %s, want 409 conflict", r)
			}
		}
		mu.Lock()
		n := runs[c.key]
		mu.Unlock()
		if n != 1 {
			t.Fatalf("%s: the backend ran %d times, want once", c.key, n)
		}
	}
}
