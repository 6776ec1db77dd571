package redislock

// A real retrying client, used as its users use it: stripe-go, with its own
// retry logic, its own timeouts and its own keys, pointed at Caddy in front
// of a slow payment backend. stripe-go runs in its own program,
// tools/stripego (built once per test binary from the tools module, so that
// stripe-go stays out of the plugin's go.mod), driven as run.js and run.py
// are. stripe-go resends a POST with the same
// Idempotency-Key after a network error; an answer whose body is in the
// shape of Stripe's errors (an error member, as every problem the plugin
// writes has) it raises at once, whatever the status (it retries only a 429
// lock_timeout). The plugin's own answers, raised by stripe-go and
// stripe-node, are in TestStripeGoAnswers and TestStripeNodeAnswers.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// chargeTime is how long the backend takes per charge: longer than the
// impatient client's timeout, and than the SDK's first retry delay (500ms).
const chargeTime = time.Second

// stripeBackend is a payment API that charges on every request it gets (a
// legacy backend with no idempotency of its own) and answers like Stripe's.
func stripeBackend(t *testing.T) (*recorder, func(key string) int) {
	t.Helper()
	var mu sync.Mutex
	n := 0
	be := newRecorder(t, func(w http.ResponseWriter, r *http.Request, s seen) {
		mu.Lock()
		n++
		id := n
		mu.Unlock()
		time.Sleep(chargeTime) // the charge goes through even if the client has gone
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Request-Id", fmt.Sprintf("req_%d", id))
		fmt.Fprintf(w, `{"id":"pi_%d","object":"payment_intent","amount":1299,"currency":"eur","status":"succeeded"}`, id)
	})
	return be, func(key string) int { return be.executions(key) }
}

// stripeGo builds tools/stripego once per test binary; a failed build
// fails every test that needs it.
var stripeGo struct {
	once sync.Once
	bin  string
	err  error
}

// requireStripeGo returns the path of the stripe-go driver.
func requireStripeGo(t *testing.T) string {
	t.Helper()
	stripeGo.once.Do(func() {
		dir, err := os.MkdirTemp("", "stripego")
		if err != nil {
			stripeGo.err = err
			return
		}
		stripeGo.bin = filepath.Join(dir, "stripego")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", "build", "-o", stripeGo.bin, "./stripego")
		cmd.Dir = "tools"
		if out, err := cmd.CombinedOutput(); err != nil {
			stripeGo.err = fmt.Errorf("go build ./stripego in tools: %v\n%s", err, out)
		}
	})
	if stripeGo.err != nil {
		t.Fatal(stripeGo.err)
	}
	return stripeGo.bin
}

// runStripeGo runs the stripe-go driver against base and returns its
// results: stripe-go with maxRetries retries and an HTTP client timeout.
func runStripeGo(t *testing.T, base string, maxRetries int, timeout time.Duration, calls []driverCase) []sdkResult {
	t.Helper()
	var results []sdkResult
	out := runDriver(t, []string{requireStripeGo(t), base}, driverInput{MaxNetworkRetries: maxRetries, TimeoutMs: int(timeout / time.Millisecond), Cases: calls})
	if err := json.Unmarshal(out, &results); err != nil {
		t.Fatal(err)
	}
	return results
}

// charge is a 12.99 EUR charge under key, on the route of account.
func charge(name, account, key string) driverCase {
	return driverCase{Name: name, Account: account, Key: key, Params: map[string]any{"amount": 1299, "currency": "eur"}}
}

// stripeSite routes by the Stripe-Account header (stripe-go takes a base
// URL without a path): account "lock" to redis_lock alone, "idem" to
// redis_lock with idempotency, "wait" to idempotency with wait.
func stripeSite(redisAddr, backend string) string {
	return fmt.Sprintf(`	@lock header Stripe-Account lock
	handle @lock {
		redis_lock {http.request.header.Idempotency-Key} {
			redis %[1]s
			prefix lock:
		}
		reverse_proxy %[2]s
	}
	@idem header Stripe-Account idem
	handle @idem {
		redis_lock {http.request.header.Idempotency-Key} {
			redis %[1]s
			prefix idem:
			idempotency
		}
		reverse_proxy %[2]s
	}
	@wait header Stripe-Account wait
	handle @wait {
		redis_lock {http.request.header.Idempotency-Key} {
			redis %[1]s
			prefix wait:
			wait 5s
			idempotency
		}
		reverse_proxy %[2]s
	}`, redisAddr, backend)
}

// A client whose timeout is shorter than the charge: stripe-go times out and
// retries with the same key after the first charge finished. Behind the
// lock alone each retry charges again; with idempotency the retry gets the
// first charge's answer.
func TestStripeSDKTimeoutRetry(t *testing.T) {
	t.Parallel()
	srv, _ := newRedis(t)
	be, charges := stripeBackend(t)
	s := startCaddySite(t, stripeSite(srv.Addr, be.hostPort()), siteOptions{})
	// The retry comes at 800ms + 500ms (stripe-go's first retry delay), after
	// the 1s charge: a retry while it runs would get 409 in-progress, which
	// stripe-go raises.
	r := runStripeGo(t, s.URL, 3, 800*time.Millisecond, []driverCase{
		charge("idem", "idem", "timeout-idem"),
		charge("lock", "lock", "timeout-lock"),
	})
	if pi := r[0].Object; !r[0].OK || pi.ID == "" || pi.Status != "succeeded" {
		t.Fatalf("stripe-go through redis_lock + idempotency: %+v", r[0])
	}
	if r[0].Attempts < 2 {
		t.Fatalf("stripe-go sent %d requests; the test needs its timeout to retry", r[0].Attempts)
	}
	if n := charges("timeout-idem"); n != 1 {
		t.Fatalf("redis_lock + idempotency: %d charges, want 1", n)
	}
	if n := charges("timeout-lock"); n < 2 {
		t.Fatalf("redis_lock alone: %d charges; the lock does not deduplicate late retries, want more than 1", n)
	} else {
		t.Logf("the same client behind redis_lock alone: %d charges", n)
	}
}

// A double click: two calls at once with one key. The second meets the
// first in progress (409), and stripe-go raises it (in-progress with
// idempotency, conflict behind the lock alone) without retrying: the error
// is in Stripe's shape. The charge runs once either way; with idempotency a
// later call with the key gets its payment intent, and with wait the second
// call waits for the first and gets it at once.
func TestStripeSDKDoubleClick(t *testing.T) {
	t.Parallel()
	srv, _ := newRedis(t)
	be, charges := stripeBackend(t)
	s := startCaddySite(t, stripeSite(srv.Addr, be.hostPort()), siteOptions{})
	for _, route := range []string{"idem", "lock", "wait"} {
		key := "double-click-" + route
		calls := []driverCase{charge("first", route, key), charge("second", route, key)}
		calls[0].Background, calls[1].Background = true, true
		if route == "idem" {
			after := charge("after", route, key)
			after.Await = true
			calls = append(calls, after)
		}
		r := runStripeGo(t, s.URL, 3, 10*time.Second, calls)
		if n := charges(key); n != 1 {
			t.Fatalf("%s: %d charges, want 1", route, n)
		}
		if route == "wait" {
			if !r[0].OK || !r[1].OK || r[0].Object.ID == "" || r[0].Object.ID != r[1].Object.ID {
				t.Fatalf("wait: %+v; want one payment intent for both", r)
			}
			continue
		}
		won, lost := 0, 1
		if !r[0].OK {
			won, lost = 1, 0
		}
		if !r[won].OK || r[won].Object.ID == "" || r[lost].OK || r[lost].Error.StatusCode == 0 {
			t.Fatalf("%s: %+v; want a payment intent and a stripe.Error", route, r)
		}
		want := map[string]string{"idem": "in-progress", "lock": "conflict"}[route]
		if se := r[lost].Error; se.StatusCode != http.StatusConflict || se.Code != want || se.RawType != "idempotency_error" {
			t.Fatalf("%s: second call raised %d %s %s, want 409 %s idempotency_error", route, se.StatusCode, se.RawType, se.Code, want)
		}
		if route == "idem" {
			if again := r[2]; !again.OK || again.Object.ID != r[won].Object.ID || charges(key) != 1 {
				t.Fatalf("idem: the call after the double click got %+v; want the first payment intent, %s", again, r[won].Object.ID)
			}
		}
	}
}

// holdTime is how long a "hold" charge takes: longer than stripe-node's
// retries of a 409 (500ms, then 0.5 to 1s) after the call that meets it.
const holdTime = 3 * time.Second

// answersBackend is a payment API in Stripe's shape that answers by the
// charge's description: "decline" a 402 card_error, "hold" a success after
// holdTime, "lost" no answer at all (the connection closed), "large" a
// success over the site's max_response, anything else a 200 success. It
// counts the charges per Idempotency-Key.
func answersBackend(t *testing.T) (*recorder, func(key string) int) {
	t.Helper()
	var mu sync.Mutex
	n := 0
	be := newRecorder(t, func(w http.ResponseWriter, r *http.Request, s seen) {
		form, _ := url.ParseQuery(string(s.Body))
		mu.Lock()
		n++
		id := n
		mu.Unlock()
		w.Header().Set("Request-Id", fmt.Sprintf("req_%d", id))
		w.Header().Set("Content-Type", "application/json")
		desc := form.Get("description")
		switch desc {
		case "decline":
			w.WriteHeader(http.StatusPaymentRequired)
			fmt.Fprintf(w, `{"error":{"type":"card_error","code":"card_declined","decline_code":"insufficient_funds","charge":"ch_%d","message":"Your card has insufficient funds."}}`, id)
			return
		case "lost":
			if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
				conn.Close()
			}
			return
		case "hold":
			time.Sleep(holdTime)
		case "large":
			desc = strings.Repeat("x", 2048)
		}
		fmt.Fprintf(w, `{"id":"pi_%d","object":"payment_intent","amount":%s,"currency":"eur","status":"succeeded","description":%q}`,
			id, form.Get("amount"), desc)
	})
	return be, func(key string) int { return be.executions(key) }
}

// answersSite routes by Stripe-Account: "idem" to idempotency (max_response
// 1KiB), "lock" to the lock alone, "order" to a lock keyed by a header the
// SDKs do not send, "down" to idempotency on a Redis that is not running.
func answersSite(t *testing.T) (*caddySite, func(key string) int) {
	t.Helper()
	srv, _ := newRedis(t)
	down, _ := newRedis(t)
	down.Stop()
	be, charges := answersBackend(t)
	s := startCaddySite(t, fmt.Sprintf(`	@idem header Stripe-Account idem
	handle @idem {
		redis_lock {http.request.header.Idempotency-Key} {
			redis %[1]s
			idempotency {
				max_response 1KiB
			}
		}
		reverse_proxy %[3]s
	}
	@lock header Stripe-Account lock
	handle @lock {
		redis_lock {http.request.header.Idempotency-Key} {
			redis %[1]s
			prefix lock:
		}
		reverse_proxy %[3]s
	}
	@order header Stripe-Account order
	handle @order {
		redis_lock {http.request.header.X-Order-Id} {
			redis %[1]s
			prefix order:
		}
		reverse_proxy %[3]s
	}
	@down header Stripe-Account down
	handle @down {
		redis_lock {http.request.header.Idempotency-Key} {
			redis %[2]s
			idempotency
		}
		reverse_proxy %[3]s
	}`, srv.Addr, down.Addr, be.hostPort()), siteOptions{})
	return s, charges
}

// sdkCall is one paymentIntents.create call of the answers tests.
type sdkCall struct {
	name    string
	account string // Stripe-Account: the route
	key     string // Idempotency-Key
	amount  int64
	desc    string
}

// sdkWant is what an SDK should make of a call: a payment intent (id "" for
// any, else the id of the call named), or an error from the status, Stripe
// error type and code; and whether it comes from the record.
type sdkWant struct {
	status   int
	errType  string // "": a payment intent
	code     string
	sameAs   string // the call whose payment intent or error this must equal
	replayed bool
}

// sdkCalls are the calls of the answers tests, in order; in-progress and
// conflict run while hold-idem and hold-lock are held. Keys get a prefix
// per SDK.
var sdkCalls = []struct {
	sdkCall
	want sdkWant
}{
	{sdkCall{"success", "idem", "ok", 1299, "ok"}, sdkWant{status: 200}},
	{sdkCall{"success-replayed", "idem", "ok", 1299, "ok"}, sdkWant{status: 200, sameAs: "success", replayed: true}},
	{sdkCall{"decline", "idem", "decline", 1299, "decline"}, sdkWant{402, "card_error", "card_declined", "", false}},
	{sdkCall{"decline-replayed", "idem", "decline", 1299, "decline"}, sdkWant{402, "card_error", "card_declined", "decline", true}},
	{sdkCall{"key-reused", "idem", "ok", 999, "ok"}, sdkWant{422, "idempotency_error", "key-reused", "", false}},
	{sdkCall{"large", "idem", "large", 1299, "large"}, sdkWant{status: 200}},
	{sdkCall{"not-replayable", "idem", "large", 1299, "large"}, sdkWant{422, "idempotency_error", "not-replayable", "", true}},
	{sdkCall{"invalid-idempotency-key", "idem", "clé", 1299, "ok"}, sdkWant{400, "invalid_request_error", "invalid-idempotency-key", "", false}},
	{sdkCall{"missing-key", "order", "order", 1299, "ok"}, sdkWant{400, "invalid_request_error", "missing-key", "", false}},
	{sdkCall{"unavailable", "down", "down", 1299, "ok"}, sdkWant{503, "api_error", "unavailable", "", false}},
	{sdkCall{"outcome-unknown", "idem", "lost", 1299, "lost"}, sdkWant{502, "api_error", "outcome-unknown", "", false}},
	{sdkCall{"outcome-unknown-replayed", "idem", "lost", 1299, "lost"}, sdkWant{502, "api_error", "outcome-unknown", "outcome-unknown", true}},
	{sdkCall{"hold-idem", "idem", "hold-idem", 1299, "hold"}, sdkWant{status: 200}},
	{sdkCall{"hold-lock", "lock", "hold-lock", 1299, "hold"}, sdkWant{status: 200}},
	{sdkCall{"in-progress", "idem", "hold-idem", 1299, "hold"}, sdkWant{409, "idempotency_error", "in-progress", "", false}},
	{sdkCall{"conflict", "lock", "hold-lock", 1299, "hold"}, sdkWant{409, "idempotency_error", "conflict", "", false}},
	{sdkCall{"hold-idem-replayed", "idem", "hold-idem", 1299, "hold"}, sdkWant{status: 200, sameAs: "hold-idem", replayed: true}},
}

// sdkResult is what an SDK made of a call, in a form both SDKs' results
// take.
type sdkResult struct {
	Name     string `json:"name"`
	OK       bool   `json:"ok"`
	Attempts int    `json:"attempts"`
	Status   int    `json:"status"`
	Replayed bool   `json:"replayed"`
	Object   struct {
		ID          string `json:"id"`
		Object      string `json:"object"`
		Amount      int64  `json:"amount"`
		Status      string `json:"status"`
		Description string `json:"description"`
	} `json:"object"`
	Error   sdkError `json:"error"`
	Failure string   `json:"failure"` // stripe-go: an error that is not a *stripe.Error
}

// sdkError is the error an SDK raised.
type sdkError struct {
	Class       string `json:"class"`
	RawType     string `json:"rawType"`
	Code        string `json:"code"`
	Message     string `json:"message"`
	DeclineCode string `json:"declineCode"`
	Charge      string `json:"charge"`
	StatusCode  int    `json:"statusCode"`
	Replayed    bool   `json:"replayed"`
	ShouldRetry string `json:"shouldRetry"`
}

// checkSDKResults checks an SDK's results against sdkCalls, and that each
// charge reached the backend once (none for the plugin's refusals); attempts
// is how many requests the SDK should have sent for a call.
func checkSDKResults(t *testing.T, sdk string, results []sdkResult, charges func(string) int, key func(string) string, attempts func(sdkWant) int) {
	t.Helper()
	if len(results) != len(sdkCalls) {
		t.Fatalf("%s: %d results for %d calls", sdk, len(results), len(sdkCalls))
	}
	byName := map[string]sdkResult{}
	details := map[string]string{}
	for _, p := range allProblems {
		details[p.p.slug] = problemDetail(t, p.p)
	}
	for i, c := range sdkCalls {
		got, w := results[i], c.want
		byName[c.name] = got
		if got.Name != c.name {
			t.Fatalf("%s: result %d is %q, want %q", sdk, i, got.Name, c.name)
		}
		// A holder's count takes in the calls that meet it.
		if n := attempts(w); got.Attempts != n && !strings.HasPrefix(c.name, "hold-") {
			t.Errorf("%s %s: %d requests sent, want %d", sdk, c.name, got.Attempts, n)
		}
		if w.errType == "" {
			o := got.Object
			if !got.OK || got.Status != w.status || o.ID == "" || o.Object != "payment_intent" || o.Amount != c.amount ||
				o.Status != "succeeded" || got.Replayed != w.replayed {
				t.Errorf("%s %s: %+v, want a payment intent of %d (replayed %v)", sdk, c.name, got, c.amount, w.replayed)
			}
			if w.sameAs != "" && byName[w.sameAs].Object != o {
				t.Errorf("%s %s: %+v, want the payment intent of %s, %+v", sdk, c.name, o, w.sameAs, byName[w.sameAs].Object)
			}
			continue
		}
		e := got.Error
		if got.OK || e.StatusCode != w.status || e.RawType != w.errType || e.Code != w.code || e.Replayed != w.replayed {
			t.Errorf("%s %s: ok %v, error %+v; want %d %s %s (replayed %v)", sdk, c.name, got.OK, e, w.status, w.errType, w.code, w.replayed)
		}
		if d, ok := details[w.code]; ok && e.Message != d {
			t.Errorf("%s %s: message %q, want the problem's detail %q", sdk, c.name, e.Message, d)
		}
		if first := byName[w.sameAs].Error; w.sameAs != "" && (first.Replayed || !e.Replayed || !sameError(first, e)) {
			t.Errorf("%s %s: error %+v, want the error of %s, %+v", sdk, c.name, e, w.sameAs, byName[w.sameAs].Error)
		}
		if (e.ShouldRetry == "false") != (w.code == "outcome-unknown") {
			t.Errorf("%s %s: Stripe-Should-Retry %q", sdk, c.name, e.ShouldRetry)
		}
	}
	if d := byName["decline"].Error; d.DeclineCode != "insufficient_funds" || d.Charge == "" || d.Message != "Your card has insufficient funds." {
		t.Errorf("%s: the backend's card error is not the SDK's: %+v", sdk, d)
	}
	wantCharges := map[string]int{"ok": 1, "decline": 1, "large": 1, "clé": 0, "order": 0, "down": 0, "lost": 1, "hold-idem": 1, "hold-lock": 1}
	for k, n := range wantCharges {
		if got := charges(key(k)); got != n {
			t.Errorf("%s: key %s charged %d times, want %d", sdk, k, got, n)
		}
	}
}

// sameError reports whether a and b are the same error but for Replayed.
func sameError(a, b sdkError) bool {
	a.Replayed, b.Replayed = false, false
	return a == b
}

// problemDetail is p's detail, read back from its body.
func problemDetail(t *testing.T, p problem) string {
	t.Helper()
	var body problemJSON
	if err := json.Unmarshal(p.json, &body); err != nil {
		t.Fatal(err)
	}
	return body.Detail
}

// stripe-go raises each of the plugin's own answers as a *stripe.Error of
// Stripe's type, with the problem's slug as its code, at once (it retries
// no answer in Stripe's error shape); the backend's answers, and their
// replays, are what the backend said.
func TestStripeGoAnswers(t *testing.T) {
	t.Parallel()
	s, charges := answersSite(t)
	key := func(k string) string { return "go-" + k }
	var calls []driverCase
	for _, c := range sdkCalls {
		gc := driverCase{Name: c.name, Account: c.account, Key: key(c.key),
			Params: map[string]any{"amount": c.amount, "currency": "eur", "description": c.desc}}
		switch c.name {
		case "hold-idem", "hold-lock": // held while in-progress and conflict run
			gc.Background, gc.PauseMs = true, 300
		case "hold-idem-replayed":
			gc.Await = true
		}
		calls = append(calls, gc)
	}
	results := runStripeGo(t, s.URL, 2, 30*time.Second, calls)
	for i, c := range sdkCalls {
		if r := results[i]; !r.OK && r.Error.Class != c.want.errType {
			t.Errorf("%s: stripe-go raised %q, want its %s error", c.name, r.Error.Class, c.want.errType)
		}
	}
	checkSDKResults(t, "stripe-go", results, charges, key, func(sdkWant) int { return 1 })
	if t.Failed() {
		for _, r := range results {
			t.Logf("%+v", r)
		}
	}
}
