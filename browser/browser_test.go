package browser

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	_ "github.com/reqlock/caddy-redis-lock"
	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

// mode is one way to configure redis_lock on the checkout route: the lines
// it adds to the redis_lock block.
type mode struct {
	name  string
	lines []string
}

var modes = []mode{
	{"lock", nil},
	{"wait", []string{"wait 3s"}},
	{"idempotency", []string{"wait 3s", "idempotency"}},
}

// scenario is what the user does on a freshly loaded checkout form.
type scenario struct {
	name string
	run  func(r *run)
}

var scenarios = []scenario{
	{"double_click", doubleClick},
	{"enter_then_click", enterThenClick},
	{"reload", reloadReceipt},
	{"back_then_pay_again", backThenPayAgain},
}

// outcome is what a scenario must end with in a mode.
type outcome struct {
	posts    int  // POSTs Chromium sent
	charges  int  // charges of the form's token at the backend
	conflict bool // ends on the 409 page; otherwise on the receipt of the last charge
}

// want is the expected outcome by mode and scenario. The first POST of a
// double submission is cancelled by Chromium but runs on at the backend
// under the lock, so the lock alone turns the second away (409), wait runs
// it after the first, and idempotency replays the first's answer.
var want = map[string]map[string]outcome{
	"lock": {
		"double_click":        {posts: 2, charges: 1, conflict: true},
		"enter_then_click":    {posts: 2, charges: 1, conflict: true},
		"reload":              {posts: 1, charges: 1},
		"back_then_pay_again": {posts: 2, charges: 2},
	},
	"wait": {
		"double_click":        {posts: 2, charges: 2},
		"enter_then_click":    {posts: 2, charges: 2},
		"reload":              {posts: 1, charges: 1},
		"back_then_pay_again": {posts: 2, charges: 2},
	},
	"idempotency": {
		"double_click":        {posts: 2, charges: 1},
		"enter_then_click":    {posts: 2, charges: 1},
		"reload":              {posts: 1, charges: 1},
		"back_then_pay_again": {posts: 2, charges: 1},
	},
}

const (
	conflictText = "Your payment is already being processed"
	receiptText  = "Payment received"
)

// TestCheckout runs every scenario in every mode: one Caddy config with a
// site per mode, one Chromium, a new browser context (tab, cache, cookies)
// per subtest.
func TestCheckout(t *testing.T) {
	chromium := requireChromium(t)
	rds := redistest.Start(t)
	app := newCheckoutApp(t)
	sites := startCaddy(t, rds.Addr, app.srv.Listener.Addr().String())
	browser := startBrowser(t, chromium)

	var rows []string
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			for _, sc := range scenarios {
				t.Run(sc.name, func(t *testing.T) {
					runScenario(t, browser, app, sites[m.name], m.name, sc, &rows)
				})
			}
		})
	}
	t.Logf("results:\n%-12s %-20s %-6s %-5s %-9s %-8s %-7s %-24s %-6s %s\n%s",
		"mode", "scenario", "result", "POSTs", "cancelled", "charges", "overlap", "final page", "time", "notes", strings.Join(rows, "\n"))
}

// run is one scenario in progress: its tab and what it saw.
type run struct {
	t     *testing.T
	ctx   context.Context
	app   *checkoutApp
	token string   // the checkout_token of the form first loaded
	notes []string // for the summary: how Back came back, and so on
	final string   // for the summary: the page the user ended on

	mu        sync.Mutex
	posts     int                          // POSTs Chromium sent
	pending   map[network.RequestID]string // document requests without an end yet
	cancelled []string                     // document requests that failed, with Chromium's error
	docs      []string                     // document requests and their statuses, in order
	restored  bool                         // a main-frame navigation restored from the bfcache
	notUsed   []string                     // why the bfcache was not used
}

// runScenario loads the form in a new browser context, runs sc and checks
// the outcome; it adds a summary row to rows, failed or not.
func runScenario(t *testing.T, browser context.Context, app *checkoutApp, site, modeName string, sc scenario, rows *[]string) {
	start := time.Now()
	w := want[modeName][sc.name]
	tabCtx, closeTab := chromedp.NewContext(browser, chromedp.WithNewBrowserContext())
	defer closeTab()
	r := &run{t: t, app: app, pending: map[network.RequestID]string{}, final: "?"}
	defer func() {
		charges := app.chargesOf(r.token)
		r.mu.Lock()
		defer r.mu.Unlock()
		status := "ok"
		if t.Failed() {
			status = "FAIL"
		}
		*rows = append(*rows, fmt.Sprintf("%-12s %-20s %-6s %-5d %-9d %-8d %-7v %-24s %-6s %s",
			modeName, sc.name, status, r.posts, len(r.cancelled), len(charges), overlapping(charges), r.final,
			time.Since(start).Round(100*time.Millisecond), strings.Join(r.notes, "; ")))
	}()
	if err := chromedp.Listen(tabCtx, r.onEvent); err != nil {
		t.Fatalf("opening a tab: %v", err)
	}
	ctx, cancel := context.WithTimeout(tabCtx, 45*time.Second)
	defer cancel()
	r.ctx = ctx
	defer r.screenshotOnFailure()

	r.do(chromedp.Navigate(site + "/checkout"))
	r.token = r.nonce()
	sc.run(r)
	st := r.settle()
	idle, cancelIdle := context.WithTimeout(ctx, 10*time.Second)
	defer cancelIdle()
	if err := app.waitIdle(idle); err != nil {
		t.Errorf("backend: %v", err)
	}

	charges := app.chargesOf(r.token)
	r.mu.Lock()
	posts, docs := r.posts, strings.Join(r.docs, ", ")
	r.mu.Unlock()
	t.Logf("POSTs sent: %d; document requests: %s; charges: %s", posts, docs, describe(charges))

	if posts != w.posts {
		t.Errorf("Chromium sent %d POSTs, want %d (document requests: %s)", posts, w.posts, docs)
	}
	if len(charges) != w.charges {
		t.Errorf("%d charges of token %s, want %d: %s", len(charges), r.token, w.charges, describe(charges))
	}
	if overlapping(charges) {
		t.Errorf("two charges of token %s overlapped at the backend: %s (the first POST, cancelled by the browser, no longer held the lock)", r.token, describe(charges))
	}
	r.final = r.checkFinal(st, w, charges)
}

// checkFinal checks the page the user ends on and describes it.
func (r *run) checkFinal(st pageState, w outcome, charges []charge) string {
	u, err := url.Parse(st.URL)
	if err != nil {
		r.t.Fatalf("final URL %q: %v", st.URL, err)
	}
	if w.conflict {
		if u.Path != "/checkout" || !strings.Contains(st.Text, conflictText) {
			r.t.Errorf("want the 409 page (%q) at /checkout, the user is on %s: %q", conflictText, st.URL, st.Text)
		}
	} else {
		wantID := "?"
		if len(charges) > 0 {
			wantID = fmt.Sprint(charges[len(charges)-1].ID)
		}
		if u.Path != "/receipt" || !strings.Contains(st.Text, receiptText) || u.Query().Get("id") != wantID {
			r.t.Errorf("want the receipt of charge %s, the user is on %s: %q", wantID, st.URL, st.Text)
		}
	}
	if strings.Contains(st.Text, "<h1>") {
		r.t.Errorf("the page shows raw markup (served as text, not HTML): %q", st.Text)
	}
	switch {
	case strings.Contains(st.Text, conflictText):
		return "409 page at " + u.Path
	case strings.Contains(st.Text, receiptText):
		return "receipt id=" + u.Query().Get("id")
	default:
		return fmt.Sprintf("%s %.40q", u.Path, st.Text)
	}
}

// doubleClick presses and releases the mouse on Pay twice, 100ms apart, the
// second press with clickCount 2 as in a real double click: two clicks, so
// two form submissions.
func doubleClick(r *run) {
	x, y := r.payButton()
	r.click(x, y, 1)
	time.Sleep(100 * time.Millisecond)
	r.click(x, y, 2)
}

// enterThenClick submits with Enter in the amount field, then clicks Pay.
func enterThenClick(r *run) {
	x, y := r.payButton()
	r.do(chromedp.Focus(chromedp.ID("amount")))
	r.pressEnter()
	time.Sleep(100 * time.Millisecond)
	r.click(x, y, 1)
}

// reloadReceipt pays once and reloads the receipt (a GET, after the 303).
func reloadReceipt(r *run) {
	x, y := r.payButton()
	r.click(x, y, 1)
	r.expectReceipt(r.settle())
	r.do(chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := cdp.Call(ctx, t, page.Reload, page.ReloadParams{})
		return err
	}))
}

// backThenPayAgain pays once, goes Back to the form and pays again. The
// form comes back with the same nonce (bfcache or HTTP cache: it is not
// no-store), so the second POST carries the first's token.
func backThenPayAgain(r *run) {
	// A page restored from the bfcache keeps its JavaScript heap.
	r.do(chromedp.Evaluate[chromedp.Void](`window.checkoutMarker = "before"`))
	renders := r.app.rendered()
	x, y := r.payButton()
	r.click(x, y, 1)
	r.expectReceipt(r.settle())
	r.do(chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		h, err := cdp.Call(ctx, t, page.GetNavigationHistory, cdp.Empty{})
		if err != nil {
			return err
		}
		if h.CurrentIndex < 1 {
			return errors.New("no history entry to go back to")
		}
		_, err = cdp.Call(ctx, t, page.NavigateToHistoryEntry, page.NavigateToHistoryEntryParams{EntryID: h.Entries[h.CurrentIndex-1].ID})
		return err
	}))
	st := r.settle()
	if u, _ := url.Parse(st.URL); u == nil || u.Path != "/checkout" || !strings.Contains(st.Text, "Checkout") {
		r.t.Fatalf("Back: want the checkout form, the user is on %s: %q", st.URL, st.Text)
	}
	marker, _ := chromedp.Run(r.ctx, chromedp.Evaluate[string](`String(window.checkoutMarker)`))
	nonce := r.nonce()
	r.mu.Lock()
	restored, notUsed := r.restored, r.notUsed
	r.mu.Unlock()
	how := "HTTP cache"
	switch {
	case r.app.rendered() != renders:
		how = "re-rendered by the backend"
	case restored || marker == "before":
		how = "bfcache"
	}
	r.notes = append(r.notes, "Back: "+how)
	if len(notUsed) > 0 {
		r.notes = append(r.notes, "bfcache not used: "+strings.Join(notUsed, ","))
	}
	r.t.Logf("Back: form from the %s (bfcache restore event %v, JS marker %q, not-used reasons %v)", how, restored, marker, notUsed)
	if nonce != r.token {
		r.t.Errorf("Back showed a new nonce %s (the first form had %s): Chromium got the form %s, not from a cache", nonce, r.token, how)
	}
	x, y = r.payButton()
	r.click(x, y, 1)
}

// onEvent records the tab's network and navigation events. It runs on the
// goroutine reading the tab's messages: no commands, nothing slow.
func (r *run) onEvent(ev any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch ev := ev.(type) {
	case *network.EventRequestWillBeSent:
		if ev.Type != network.ResourceTypeDocument {
			return
		}
		req := ev.Request.Method + " " + pathOf(ev.Request.URL)
		if ev.RedirectResponse != nil {
			r.docs = append(r.docs, fmt.Sprintf("%s %d%s", r.pending[ev.RequestID], ev.RedirectResponse.Status, replayed(ev.RedirectResponse)))
		}
		if ev.Request.Method == "POST" {
			r.posts++
		}
		r.pending[ev.RequestID] = req
	case *network.EventResponseReceived:
		if req, ok := r.pending[ev.RequestID]; ok {
			r.docs = append(r.docs, fmt.Sprintf("%s %d%s", req, ev.Response.Status, replayed(ev.Response)))
		}
	case *network.EventLoadingFinished:
		delete(r.pending, ev.RequestID)
	case *network.EventLoadingFailed:
		if req, ok := r.pending[ev.RequestID]; ok {
			r.cancelled = append(r.cancelled, req+": "+ev.ErrorText)
			r.docs = append(r.docs, req+" "+ev.ErrorText)
			delete(r.pending, ev.RequestID)
		}
	case *page.EventFrameNavigated:
		if ev.Frame.ParentID == "" && ev.Type == page.NavigationTypeBackForwardCacheRestore {
			r.restored = true
			r.docs = append(r.docs, "bfcache restore of "+pathOf(ev.Frame.URL))
		}
	case *page.EventBackForwardCacheNotUsed:
		for _, e := range ev.NotRestoredExplanations {
			r.notUsed = append(r.notUsed, string(e.Reason))
		}
	}
}

// replayed marks an answer that idempotency replayed from Redis.
func replayed(resp *network.Response) string {
	for k, v := range resp.Headers {
		if strings.EqualFold(k, "Idempotent-Replayed") && fmt.Sprint(v) == "true" {
			return " (replayed)"
		}
	}
	return ""
}

func pathOf(raw string) string {
	if u, err := url.Parse(raw); err == nil {
		return u.RequestURI()
	}
	return raw
}

// do runs actions in the tab, failing the test on an error.
func (r *run) do(actions ...chromedp.Action[chromedp.Void]) {
	r.t.Helper()
	if err := chromedp.Do(r.ctx, actions...); err != nil {
		r.t.Fatalf("chromedp: %v", err)
	}
}

// nonce is the checkout_token of the form on the page.
func (r *run) nonce() string {
	r.t.Helper()
	// Not chromedp.Value: its DOM query waits forever for a node after a
	// history navigation (the tab's DOM tree it tracks is stale then).
	v, err := chromedp.Run(r.ctx, chromedp.Evaluate[string](`document.querySelector('input[name="checkout_token"]').value`))
	if err != nil || v == "" {
		r.t.Fatalf("reading the form's checkout_token: %q, %v", v, err)
	}
	return v
}

// payButton is the center of the Pay button, in viewport pixels.
func (r *run) payButton() (x, y float64) {
	r.t.Helper()
	c, err := chromedp.Run(r.ctx, chromedp.Evaluate[[]float64](`(() => {
		const b = document.getElementById("pay").getBoundingClientRect();
		return [b.left + b.width / 2, b.top + b.height / 2];
	})()`))
	if err != nil || len(c) != 2 {
		r.t.Fatalf("locating the Pay button: %v %v", c, err)
	}
	return c[0], c[1]
}

// click moves the mouse to x, y and presses and releases the left button,
// as a user's click with clickCount n (2 for the second click of a double
// click).
func (r *run) click(x, y float64, n int64) {
	r.t.Helper()
	r.do(chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		for _, p := range []input.DispatchMouseEventParams{
			{Type: input.DispatchMouseEventTypeMouseMoved, X: x, Y: y},
			{Type: input.DispatchMouseEventTypeMousePressed, X: x, Y: y, Button: input.MouseButtonLeft, Buttons: 1, ClickCount: n},
			{Type: input.DispatchMouseEventTypeMouseReleased, X: x, Y: y, Button: input.MouseButtonLeft, ClickCount: n},
		} {
			if _, err := cdp.Call(ctx, t, input.DispatchMouseEvent, p); err != nil {
				return err
			}
		}
		return nil
	}))
}

// pressEnter presses and releases Enter in the focused element, as
// Puppeteer's keyboard.press does: keyDown with the text "\r" is
// Chromium's rawKeyDown and char, and the char submits the form.
func (r *run) pressEnter() {
	r.t.Helper()
	r.do(chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		for _, p := range []input.DispatchKeyEventParams{
			{Type: input.DispatchKeyEventTypeKeyDown, Key: "Enter", Code: "Enter", Text: "\r", UnmodifiedText: "\r", WindowsVirtualKeyCode: 13, NativeVirtualKeyCode: 13},
			{Type: input.DispatchKeyEventTypeKeyUp, Key: "Enter", Code: "Enter", WindowsVirtualKeyCode: 13, NativeVirtualKeyCode: 13},
		} {
			if _, err := cdp.Call(ctx, t, input.DispatchKeyEvent, p); err != nil {
				return err
			}
		}
		return nil
	}))
}

// pageState is what the user sees: the location and the body's text.
type pageState struct {
	URL, Ready, Text string
}

// settle waits until no document request is in flight and the page has
// loaded and stayed the same for 500ms, at most 15s; a click's navigation
// shows up only once its request starts, hence the quiet period.
func (r *run) settle() pageState {
	r.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	var last pageState
	stable := 0
	for {
		ctx, cancel := context.WithTimeout(r.ctx, 2*time.Second)
		v, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[location.href, document.readyState, document.body ? document.body.innerText : ""]`))
		cancel()
		var st pageState
		if err == nil && len(v) == 3 {
			st = pageState{URL: v[0], Ready: v[1], Text: v[2]}
		}
		r.mu.Lock()
		busy := len(r.pending)
		r.mu.Unlock()
		if err == nil && busy == 0 && st.Ready == "complete" && st == last {
			stable++
		} else {
			stable = 0
		}
		last = st
		if stable >= 5 {
			return st
		}
		if time.Now().After(deadline) || r.ctx.Err() != nil {
			r.mu.Lock()
			pending := fmt.Sprint(r.pending)
			r.mu.Unlock()
			r.t.Fatalf("the page did not settle within 15s: %s (%s) %q; document requests in flight: %s; last error: %v",
				last.URL, last.Ready, last.Text, pending, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// expectReceipt fails the test unless st is a receipt page.
func (r *run) expectReceipt(st pageState) {
	r.t.Helper()
	if u, _ := url.Parse(st.URL); u == nil || u.Path != "/receipt" || !strings.Contains(st.Text, receiptText) {
		r.t.Fatalf("want a receipt after paying, the user is on %s: %q", st.URL, st.Text)
	}
}

// screenshotOnFailure saves a full-page screenshot of a failed subtest
// under failures/ (gitignored) and logs its path.
func (r *run) screenshotOnFailure() {
	if !r.t.Failed() {
		return
	}
	ctx, cancel := context.WithTimeout(r.ctx, 10*time.Second)
	defer cancel()
	if r.ctx.Err() != nil { // the tab's time is up: give the shot its own
		ctx, cancel = context.WithTimeout(context.WithoutCancel(r.ctx), 10*time.Second)
		defer cancel()
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		r.t.Logf("no screenshot: %v", err)
		return
	}
	name := strings.NewReplacer("/", "_", " ", "_").Replace(r.t.Name()) + ".png"
	path, _ := filepath.Abs(filepath.Join("failures", name))
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		r.t.Logf("no screenshot: %v", err)
		return
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		r.t.Logf("no screenshot: %v", err)
		return
	}
	r.t.Logf("screenshot: %s", path)
}

// requireChromium returns Chromium's path, skipping the test without it, or
// failing it when REDISLOCK_REQUIRE_REDIS=1 or CI=true (as redistest does
// for redis-server), so that CI never passes by skipping.
func requireChromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	msg := "chromium not found: install Debian's chromium package (apt-get install -y chromium)"
	if os.Getenv(redistest.RequireEnv) == "1" || os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// startBrowser starts one headless Chromium for the whole test, with a
// fresh profile; the subtests open their tabs in it. The whole run is
// bounded: when the bound passes, the browser is stopped.
func startBrowser(t *testing.T, path string) context.Context {
	t.Helper()
	bound, cancelBound := context.WithTimeout(context.Background(), 8*time.Minute)
	alloc, cancelAlloc := chromedp.NewExecAllocator(bound,
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.UserDataDir(t.TempDir()),
		// Without these, Chromium calls out to Google's services, and
		// connections to the outside are refused here.
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		// Tabs other than the first must keep their timers and renderer
		// running in headless mode.
		chromedp.Flag("disable-background-timer-throttling", true),
		chromedp.Flag("disable-backgrounding-occluded-windows", true),
		chromedp.Flag("disable-renderer-backgrounding", true),
		chromedp.Flag("disable-dev-shm-usage", true),
	)
	browser, cancelBrowser := chromedp.NewContext(alloc)
	t.Cleanup(func() {
		cancelBrowser()
		cancelAlloc() // waits for Chromium to exit, before TempDir is removed
		cancelBound()
	})
	// The first Run binds the browser's life to its context, so it gets no
	// timeout of its own: it is waited for here instead.
	started := make(chan error, 1)
	go func() { started <- chromedp.Do(browser) }()
	select {
	case err := <-started:
		if err != nil {
			t.Fatalf("starting %s: %v", path, err)
		}
	case <-time.After(30 * time.Second):
		cancelAlloc()
		t.Fatalf("%s did not start within 30s", path)
	}
	return browser
}

// startCaddy loads one Caddy config with a site per mode, each on a free
// port, and returns the sites' URLs by mode name.
func startCaddy(t *testing.T, redisAddr, backend string) map[string]string {
	t.Helper()
	storage := t.TempDir()
	for attempt := 1; ; attempt++ {
		urls := map[string]string{}
		var sites strings.Builder
		for _, m := range modes {
			port, err := redistest.FreePort()
			if err != nil {
				t.Fatal(err)
			}
			urls[m.name] = fmt.Sprintf("http://127.0.0.1:%d", port)
			fmt.Fprintf(&sites, "\n# %s\n%s {\n%s}\n", m.name, urls[m.name], checkoutSite(redisAddr, backend, m.lines))
		}
		cf := fmt.Sprintf(`{
	admin off
	persist_config off
	auto_https off
	skip_install_trust
	grace_period 1s
	storage file_system %s
	log {
		level WARN
	}
}
%s`, storage, sites.String())
		err := loadCaddyfile(cf)
		if err == nil {
			t.Cleanup(func() {
				if err := caddy.Stop(); err != nil {
					t.Logf("caddy.Stop: %v", err)
				}
			})
			t.Logf("Caddyfile:\n%s", cf)
			return urls
		}
		// A free port can be taken before Caddy binds it: new ports.
		if attempt == 5 || !strings.Contains(err.Error(), "address already in use") {
			t.Fatalf("loading the Caddyfile: %v\n%s", err, cf)
		}
	}
}

// checkoutSite is the body of one site: POSTs to /checkout locked by the
// form's checkout_token, errors shown as HTML pages (a browser shows
// problem+json raw), everything else proxied as it is.
func checkoutSite(redisAddr, backend string, modeLines []string) string {
	var extra strings.Builder
	for _, l := range modeLines {
		extra.WriteString("\t\t\t" + l + "\n")
	}
	return fmt.Sprintf(`	@pay method POST
	route /checkout* {
		redis_lock @pay checkout:{http.redis_lock.form.checkout_token} {
			redis %[1]s
			ttl 5s
%[3]s			errors handle_errors
		}
		reverse_proxy %[2]s
	}
	reverse_proxy %[2]s

	handle_errors 409 {
		header Content-Type "text/html; charset=utf-8"
		respond "<!doctype html><title>Payment in progress</title><h1>%[4]s</h1><p>Please wait a moment, then check your receipts.</p>" 409
	}
	handle_errors {
		header Content-Type "text/html; charset=utf-8"
		respond "<!doctype html><title>Error</title><h1>Something went wrong {err.status_code}</h1>" {err.status_code}
	}
`, redisAddr, backend, extra.String(), conflictText)
}

// loadCaddyfile adapts cf with the caddyfile adapter and runs it.
func loadCaddyfile(cf string) error {
	cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cf), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		return err
	}
	return caddy.Load(cfg, true)
}
