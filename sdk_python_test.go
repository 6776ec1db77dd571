package redislock

// stripe-python, Stripe's official Python SDK, against the plugin's answers:
// the version a python3 on the machine has (Debian's python3-stripe in make
// test and CI), driven by testdata/stripe-python/run.py. The test was
// written against stripe-python 5.0.0 (Debian bookworm's python3-stripe, the
// same code as upstream tag v5.0.0); the file and line references below are
// to that version, under stripe/ in /usr/lib/python3/dist-packages. It logs
// the version it finds: later releases moved the modules (stripe._error,
// stripe._http_client) and changed some defaults.

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

// stripePythonDir holds the driver of the stripe-python tests.
var stripePythonDir = filepath.Join("testdata", "stripe-python")

// stripePythonWritten is the stripe-python version the test was written
// against.
const stripePythonWritten = "5.0.0"

// requireStripePython returns a python3 that imports stripe, and the
// stripe-python version it has: Debian's /usr/bin/python3 first (where
// python3-stripe installs it), then the python3 on PATH. Without one the
// test is skipped, or fails when REDISLOCK_REQUIRE_REDIS=1 or CI=true (make
// test, CI).
func requireStripePython(t *testing.T) (python, version string) {
	t.Helper()
	candidates := []string{"/usr/bin/python3"}
	if p, err := exec.LookPath("python3"); err == nil && p != candidates[0] {
		candidates = append(candidates, p)
	}
	var tried []string
	for _, p := range candidates {
		if _, err := os.Stat(p); err != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		out, err := exec.CommandContext(ctx, p, filepath.Join(stripePythonDir, "run.py"), "--version").CombinedOutput()
		cancel()
		if err == nil {
			return p, strings.TrimSpace(string(out))
		}
		tried = append(tried, p+": "+strings.TrimSpace(lastLine(string(out))))
	}
	msg := "no python3 that can import stripe"
	if len(tried) > 0 {
		msg += " (" + strings.Join(tried, "; ") + ")"
	}
	msg += ": install python3-stripe (apt-get install python3-stripe), or stripe for the python3 on PATH"
	if os.Getenv(redistest.RequireEnv) == "1" || os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return "", ""
}

// lastLine is the last line of s, as a Python traceback ends with its
// error.
func lastLine(s string) string {
	s = strings.TrimSpace(s)
	return s[strings.LastIndexByte(s, '\n')+1:]
}

// pythonException is what run.py reports of the exception itself, beside
// the error it read from it.
type pythonException struct {
	Module string  `json:"module"`
	Code   *string `json:"code"` // the exception's code attribute
}

// runStripePython runs run.py against base with the calls, and returns its
// results and, for each, the exception raised (nil for a success).
func runStripePython(t *testing.T, python, base string, maxRetries int, calls []driverCase) ([]sdkResult, []*pythonException) {
	t.Helper()
	out := runDriver(t, []string{python, filepath.Join(stripePythonDir, "run.py"), base}, driverInput{MaxNetworkRetries: maxRetries, Cases: calls})
	var results []sdkResult
	var excs []struct {
		Exception *pythonException `json:"exception"`
	}
	if err := json.Unmarshal(out, &results); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(out, &excs); err != nil {
		t.Fatal(err)
	}
	exceptions := make([]*pythonException, len(excs))
	for i, e := range excs {
		exceptions[i] = e.Exception
	}
	return results, exceptions
}

// pythonErrorClass is the class stripe-python raises for an error answer
// of status whose error member has type errType:
// APIRequestor.specific_api_error (api_requestor.py:161-213) picks it by the
// status, and by the type only for a 400 or 404.
func pythonErrorClass(status int, errType string) string {
	switch {
	case status == 429:
		return "RateLimitError"
	case status == 400 || status == 404:
		if errType == "idempotency_error" {
			return "IdempotencyError"
		}
		return "InvalidRequestError"
	case status == 401:
		return "AuthenticationError"
	case status == 402:
		return "CardError"
	case status == 403:
		return "PermissionError"
	}
	return "APIError" // 409, 422 and 5xx among them
}

// pythonShouldRetry is HTTPClient._should_retry (http_client.py:183-218)
// for an answer, with retries left: Stripe-Should-Retry decides when it is
// "true" or "false", then a 409 and every status from 500 are retried.
func pythonShouldRetry(status int, shouldRetry string) bool {
	switch shouldRetry {
	case "false":
		return false
	case "true":
		return true
	}
	return status == 409 || status >= 500
}

// stripe-python raises each of the plugin's own answers as a
// stripe.error.StripeError: InvalidRequestError for its 400s, APIError for
// the others (it takes Stripe's error type into account only for a 400 or
// 404, so a 409 or 422 idempotency_error is an APIError), after its retries
// for a 409 or a 503 and at once for the others and for the stored
// outcome-unknown (Stripe-Should-Retry: false). The backend's answers, and
// their replays, are what the backend said.
func TestStripePythonAnswers(t *testing.T) {
	t.Parallel()
	python, version := requireStripePython(t)
	t.Logf("stripe-python %s (%s); written against %s", version, python, stripePythonWritten)
	s, charges := answersSite(t)
	// stripe.max_network_retries is 0 unless set (__init__.py:25).
	const maxRetries = 2
	key := func(k string) string { return "python-" + k }
	var calls []driverCase
	for _, c := range sdkCalls {
		pc := driverCase{Name: c.name, Account: c.account, Key: key(c.key),
			Params: map[string]any{"amount": c.amount, "currency": "eur", "description": c.desc}}
		// The holds start together, 300ms before in-progress and
		// conflict: stripe-python waits out their Retry-After of 1s
		// between attempts (_sleep_time_seconds takes the longer of it
		// and the backoff, http_client.py:236-255), so their last
		// attempts come about 2.3s after the holds start, well before
		// holdTime.
		switch c.name {
		case "hold-idem":
			pc.Background = true
		case "hold-lock":
			pc.Background, pc.PauseMs = true, 300
		case "in-progress", "conflict": // both retried while the holds last
			pc.Background = true
		case "hold-idem-replayed":
			pc.Await = true
		}
		calls = append(calls, pc)
	}
	results, exceptions := runStripePython(t, python, s.URL, maxRetries, calls)
	if len(exceptions) != len(sdkCalls) {
		t.Fatalf("stripe-python: %d results for %d calls", len(exceptions), len(sdkCalls))
	}

	for i, c := range sdkCalls {
		r, e := results[i], exceptions[i]
		if r.OK || c.want.errType == "" {
			continue
		}
		if want := pythonErrorClass(c.want.status, c.want.errType); r.Error.Class != want {
			t.Errorf("%s: stripe-python raised %s, want %s", c.name, r.Error.Class, want)
		}
		if e == nil || (e.Module != "stripe.error" && e.Module != "stripe._error") {
			t.Errorf("%s: exception %+v, want one of stripe.error's classes", c.name, e)
			continue
		}
		// The exception's code attribute is set by CardError and
		// InvalidRequestError alone (api_requestor.py:183-205); the others
		// leave it None, and the code is on e.error, the error object.
		switch r.Error.Class {
		case "CardError", "InvalidRequestError":
			if e.Code == nil || *e.Code != c.want.code {
				t.Errorf("%s: %s.code is %v, want %q", c.name, r.Error.Class, e.Code, c.want.code)
			}
		default:
			if e.Code != nil {
				t.Errorf("%s: %s.code is %q, want None", c.name, r.Error.Class, *e.Code)
			}
		}
	}
	checkSDKResults(t, "stripe-python", results, charges, key, func(w sdkWant) int {
		// The plugin's answers carry Stripe-Should-Retry only as "false",
		// and only on outcome-unknown (checkSDKResults checks it).
		shouldRetry := ""
		if w.code == "outcome-unknown" {
			shouldRetry = "false"
		}
		if w.errType != "" && pythonShouldRetry(w.status, shouldRetry) {
			return 1 + maxRetries
		}
		return 1
	})
	if t.Failed() {
		for i, r := range results {
			t.Logf("%+v %+v", r, exceptions[i])
		}
	}
}
