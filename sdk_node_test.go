package redislock

// stripe-node, Stripe's official Node SDK, against the plugin's answers: the
// version pinned in testdata/stripe-node/package-lock.json, installed with
// `npm ci` when node_modules is missing, driven by testdata/stripe-node/run.js.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

// stripeNodeDir holds the Node project of the stripe-node tests.
var stripeNodeDir = filepath.Join("testdata", "stripe-node")

// nodeDeps installs the Node dependencies once per test binary.
var nodeDeps struct {
	once sync.Once
	err  error
}

// errNoNPM says npm is missing, so node_modules cannot be installed.
var errNoNPM = errors.New("npm not found on PATH")

// requireStripeNode returns node's path once stripe-node is installed in
// testdata/stripe-node (npm ci, when node_modules is missing or holds
// another version than package.json pins). Without node or npm the test is
// skipped, or fails when REDISLOCK_REQUIRE_REDIS=1 or CI=true (make test,
// CI); a failed npm ci always fails it.
func requireStripeNode(t *testing.T) string {
	t.Helper()
	missing := func(msg string) {
		msg += ": install Node.js 20 or later with npm (the test runs npm ci in " + stripeNodeDir + " itself)"
		if os.Getenv(redistest.RequireEnv) == "1" || os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		missing("node not found on PATH")
	}
	nodeDeps.once.Do(func() { nodeDeps.err = installStripeNode() })
	if errors.Is(nodeDeps.err, errNoNPM) {
		missing(nodeDeps.err.Error())
	}
	if nodeDeps.err != nil {
		t.Fatal(nodeDeps.err)
	}
	return node
}

// installStripeNode runs npm ci in stripeNodeDir unless node_modules holds
// the pinned stripe version already.
func installStripeNode() error {
	want, err := packageVersion(filepath.Join(stripeNodeDir, "package.json"), true)
	if err != nil {
		return err
	}
	if have, err := packageVersion(filepath.Join(stripeNodeDir, "node_modules", "stripe", "package.json"), false); err == nil && have == want {
		return nil
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		return errNoNPM
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, npm, "ci", "--prefix", stripeNodeDir, "--no-audit", "--no-fund")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("npm ci --prefix %s: %v\n%s", stripeNodeDir, err, out)
	}
	if have, err := packageVersion(filepath.Join(stripeNodeDir, "node_modules", "stripe", "package.json"), false); err != nil || have != want {
		return fmt.Errorf("after npm ci, stripe is %q (%v), want %s", have, err, want)
	}
	return nil
}

// packageVersion reads the stripe version that a package.json depends on
// (dependency) or is (the installed package's own).
func packageVersion(path string, dependency bool) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	var pkg struct {
		Version      string            `json:"version"`
		Dependencies map[string]string `json:"dependencies"`
	}
	if err := json.Unmarshal(b, &pkg); err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	if dependency {
		return pkg.Dependencies["stripe"], nil
	}
	return pkg.Version, nil
}

// driverCase is one call of an SDK driver (run.js, run.py): the same
// shape for each.
type driverCase struct {
	Name       string         `json:"name"`
	Account    string         `json:"account"`
	Key        string         `json:"key"`
	Params     map[string]any `json:"params"`
	Background bool           `json:"background,omitempty"`
	Await      bool           `json:"awaitBackground,omitempty"`
	PauseMs    int            `json:"pauseMs,omitempty"`
}

// driverInput is what an SDK driver reads on its standard input: the SDK's
// retries, its HTTP timeout (the stripe-go driver only; 0 for the SDK's
// default) and the calls.
type driverInput struct {
	MaxNetworkRetries int          `json:"maxNetworkRetries"`
	TimeoutMs         int          `json:"timeoutMs,omitempty"`
	Cases             []driverCase `json:"cases"`
}

// runDriver runs an SDK driver, argv (the program, its script if any, the
// base URL), with in on its standard input, and returns what it printed: a
// JSON list of results.
func runDriver(t *testing.T, argv []string, in driverInput) []byte {
	t.Helper()
	stdin, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stdin = bytes.NewReader(stdin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	out, err := cmd.Output()
	name := filepath.Base(argv[0])
	if len(argv) > 2 {
		name += " " + filepath.Base(argv[1])
	}
	t.Logf("%s: %d calls in %v", name, len(in.Cases), time.Since(start).Round(time.Millisecond))
	if err != nil {
		t.Fatalf("%s: %v\nstderr: %s\nstdout: %s", name, err, stderr.String(), out)
	}
	var results []json.RawMessage
	if err := json.Unmarshal(out, &results); err != nil || len(results) != len(in.Cases) {
		t.Fatalf("%s printed %q: %v, want %d results (stderr %s)", name, out, err, len(in.Cases), stderr.String())
	}
	return out
}

// runStripeNode runs run.js against base with the calls, and returns its
// results.
func runStripeNode(t *testing.T, node, base string, maxRetries int, calls []driverCase) []sdkResult {
	t.Helper()
	var results []sdkResult
	if err := json.Unmarshal(runDriver(t, []string{node, filepath.Join(stripeNodeDir, "run.js"), base}, driverInput{MaxNetworkRetries: maxRetries, Cases: calls}), &results); err != nil {
		t.Fatal(err)
	}
	return results
}

// stripe-node raises each of the plugin's own answers as an error (before,
// it took any JSON body without an error member for a payment intent,
// whatever the status): after its retries for a 409 or a 503, at once for
// the others and for the stored outcome-unknown (Stripe-Should-Retry:
// false). The backend's answers, and their replays, are what the backend
// said.
func TestStripeNodeAnswers(t *testing.T) {
	t.Parallel()
	node := requireStripeNode(t)
	s, charges := answersSite(t)
	const maxRetries = 2
	key := func(k string) string { return "node-" + k }
	var calls []driverCase
	for _, c := range sdkCalls {
		nc := driverCase{Name: c.name, Account: c.account, Key: key(c.key),
			Params: map[string]any{"amount": c.amount, "currency": "eur", "description": c.desc}}
		switch c.name {
		case "hold-idem", "hold-lock":
			nc.Background, nc.PauseMs = true, 300
		case "in-progress", "conflict": // both retried while the holds last
			nc.Background = true
		case "hold-idem-replayed":
			nc.Await = true
		}
		calls = append(calls, nc)
	}
	results := runStripeNode(t, node, s.URL, maxRetries, calls)

	// stripe-node picks its error class by the status (StripeAPIError but
	// for 400, 402 and a few others), and keeps Stripe's type as rawType.
	class := map[int]string{400: "StripeInvalidRequestError", 402: "StripeCardError"}
	for i, c := range sdkCalls {
		r := results[i]
		if r.OK || c.want.errType == "" {
			continue
		}
		want, ok := class[c.want.status]
		if !ok {
			want = "StripeAPIError"
		}
		if r.Error.Class != want {
			t.Errorf("%s: stripe-node raised %s, want %s", c.name, r.Error.Class, want)
		}
	}
	checkSDKResults(t, "stripe-node", results, charges, key, func(w sdkWant) int {
		// stripe-node retries a 409 and a 5xx, unless Stripe-Should-Retry
		// says false (outcome-unknown).
		if w.status == 409 || (w.status >= 500 && w.code != "outcome-unknown") {
			return 1 + maxRetries
		}
		return 1
	})
	if t.Failed() {
		for _, r := range results {
			t.Logf("%+v", r)
		}
	}
}

// The Node project pins an exact stripe version, in package.json and in its
// lock file, so that npm ci installs what the tests were written against.
func TestStripeNodePinned(t *testing.T) {
	want, err := packageVersion(filepath.Join(stripeNodeDir, "package.json"), true)
	if err != nil {
		t.Fatal(err)
	}
	if want == "" || strings.ContainsAny(want, "^~<>=*x ") {
		t.Fatalf("package.json depends on stripe %q, want an exact version", want)
	}
	b, err := os.ReadFile(filepath.Join(stripeNodeDir, "package-lock.json"))
	if err != nil {
		t.Fatal(err)
	}
	var lock struct {
		Packages map[string]struct {
			Version string `json:"version"`
		} `json:"packages"`
	}
	if err := json.Unmarshal(b, &lock); err != nil {
		t.Fatal(err)
	}
	if got := lock.Packages["node_modules/stripe"].Version; got != want {
		t.Fatalf("package-lock.json has stripe %q, package.json %q", got, want)
	}
}
