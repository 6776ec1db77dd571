package redislock

// A real retrying client, used as its users use it: stripe-go, with its own
// retry logic (it resends a POST with the same Idempotency-Key after a
// network error, a 409 or a 5xx), its own timeouts and its own keys,
// pointed at Caddy in front of a slow payment backend.

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v82"
)

// chargeTime is how long the backend takes per charge: longer than the
// impatient client's timeout, and than the SDK's first retry delay (500ms).
const chargeTime = time.Second

// stripeBackend is a payment API that charges on every request it gets (a
// legacy backend with no idempotency of its own) and answers like Stripe's.
func stripeBackend(t *testing.T) (*recorder, func(key string) int) {
	t.Helper()
	var mu sync.Mutex
	charges := map[string]int{}
	n := 0
	be := newRecorder(t, func(w http.ResponseWriter, r *http.Request, s seen) {
		mu.Lock()
		charges[s.Key]++
		n++
		id := n
		mu.Unlock()
		time.Sleep(chargeTime) // the charge goes through even if the client has gone
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Request-Id", fmt.Sprintf("req_%d", id))
		fmt.Fprintf(w, `{"id":"pi_%d","object":"payment_intent","amount":1299,"currency":"eur","status":"succeeded"}`, id)
	})
	return be, func(key string) int {
		mu.Lock()
		defer mu.Unlock()
		return charges[key]
	}
}

// stripeClient is stripe-go with up to 3 retries, pointed at base.
func stripeClient(base string, timeout time.Duration) *stripe.Client {
	backends := stripe.NewBackendsWithConfig(&stripe.BackendConfig{
		URL:               stripe.String(base),
		HTTPClient:        &http.Client{Timeout: timeout},
		MaxNetworkRetries: stripe.Int64(3),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	return stripe.NewClient("sk_test_caddy_redis_lock", stripe.WithBackends(backends))
}

// stripeSite routes by the Stripe-Account header (stripe-go takes a base
// URL without a path): account "lock" to redis_lock alone, "idem" to
// redis_lock with idempotency.
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
	}`, redisAddr, backend)
}

// chargeParams is a charge under key, on the route of account.
func chargeParams(account, key string) *stripe.PaymentIntentCreateParams {
	p := &stripe.PaymentIntentCreateParams{Amount: stripe.Int64(1299), Currency: stripe.String("eur")}
	p.SetIdempotencyKey(key)
	p.SetStripeAccount(account)
	return p
}

// A client whose timeout is shorter than the charge: stripe-go times out,
// retries with the same key, meets the request in progress (409), retries
// again. Behind the lock alone each retry charges again; with idempotency
// the retry gets the first charge's answer.
func TestStripeSDKTimeoutRetry(t *testing.T) {
	t.Parallel()
	srv, _ := newRedis(t)
	be, charges := stripeBackend(t)
	s := startCaddySite(t, stripeSite(srv.Addr, be.hostPort()), siteOptions{})
	sc := stripeClient(s.URL, 600*time.Millisecond)
	pi, err := sc.V1PaymentIntents.Create(context.Background(), chargeParams("idem", "timeout-idem"))
	if err != nil {
		t.Fatalf("stripe-go through redis_lock + idempotency: %v", err)
	}
	if pi.ID == "" || pi.Status != stripe.PaymentIntentStatusSucceeded {
		t.Fatalf("payment intent %+v", pi)
	}
	if n := charges("timeout-idem"); n != 1 {
		t.Fatalf("redis_lock + idempotency: %d charges, want 1", n)
	}

	_, _ = sc.V1PaymentIntents.Create(context.Background(), chargeParams("lock", "timeout-lock"))
	if n := charges("timeout-lock"); n < 2 {
		t.Fatalf("redis_lock alone: %d charges; the lock does not deduplicate late retries, want more than 1", n)
	} else {
		t.Logf("the same client behind redis_lock alone: %d charges", n)
	}
}

// A double click: two calls at once with one key. The second meets the
// first in progress (409), and stripe-go retries it. With idempotency it
// gets the first call's payment intent; behind the lock alone, its retry
// after the first finished charges again.
func TestStripeSDKDoubleClick(t *testing.T) {
	t.Parallel()
	srv, _ := newRedis(t)
	be, charges := stripeBackend(t)
	s := startCaddySite(t, stripeSite(srv.Addr, be.hostPort()), siteOptions{})
	for _, route := range []string{"idem", "lock"} {
		key := "double-click-" + route
		sc := stripeClient(s.URL, 10*time.Second)
		var wg sync.WaitGroup
		ids := make([]string, 2)
		errs := make([]error, 2)
		for i := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				pi, err := sc.V1PaymentIntents.Create(context.Background(), chargeParams(route, key))
				errs[i] = err
				if pi != nil {
					ids[i] = pi.ID
				}
			}()
		}
		wg.Wait()
		switch route {
		case "idem":
			if errs[0] != nil || errs[1] != nil || ids[0] == "" || ids[0] != ids[1] {
				t.Fatalf("idempotency: ids %q, errors %v; want one payment intent for both", ids, errs)
			}
			if n := charges(key); n != 1 {
				t.Fatalf("idempotency: %d charges, want 1", n)
			}
		case "lock":
			if n := charges(key); n != 2 {
				t.Fatalf("lock alone: %d charges; want 2 (the retry after the first finished runs again)", n)
			}
		}
	}
}
