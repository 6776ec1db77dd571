// Package browser tests redis_lock with a real browser: a checkout form in
// headless Chromium, driven through the DevTools protocol (chromedp), in front
// of a legacy payment backend that keeps charging after its client is gone.
//
// A user's double click, Enter then click, reload and Back differ from what
// an HTTP client sends: Chromium cancels the first form submission when the
// second starts, follows the 303 to the receipt, and serves Back from its
// back/forward cache. The tests count the POSTs Chromium sent, the charges
// the backend made, and read the page the user ends on, in each mode: the
// lock alone, the lock with wait, and idempotency.
//
// It is a module of its own so that chromedp never enters the plugin's
// go.mod. It needs chromium (Debian's package) and redis-server; without
// them the tests are skipped, or fail when REDISLOCK_REQUIRE_REDIS=1 or
// CI=true.
package browser
