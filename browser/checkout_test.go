package browser

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"html"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// chargeTime is how long a charge takes at the backend: long enough for a
// second click to arrive while the first is running.
const chargeTime = 600 * time.Millisecond

// checkoutApp is a legacy checkout backend: it renders a form with a fresh
// nonce, and charges each POST it receives without watching the request's
// context, as most payment backends do (a closed connection does not stop a
// charge that is under way).
type checkoutApp struct {
	srv *httptest.Server

	mu       sync.Mutex
	charges  []charge
	renders  int // GET /checkout answered
	inflight int // charges under way
}

// charge is one charge the backend made. End is zero while it runs.
type charge struct {
	ID         int
	Token      string
	Start, End time.Time
}

func newCheckoutApp(t *testing.T) *checkoutApp {
	t.Helper()
	a := &checkoutApp{}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /checkout", a.form)
	mux.HandleFunc("POST /checkout", a.pay)
	mux.HandleFunc("GET /receipt", a.receipt)
	a.srv = httptest.NewServer(mux)
	t.Cleanup(a.srv.Close)
	return a
}

// form renders the checkout form with a new checkout_token. It sends no
// Cache-Control, as a legacy app does, so Back may show it from a cache.
func (a *checkoutApp) form(w http.ResponseWriter, _ *http.Request) {
	var b [16]byte
	_, _ = rand.Read(b[:])
	a.mu.Lock()
	a.renders++
	a.mu.Unlock()
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	fmt.Fprintf(w, `<!doctype html>
<html><head><meta charset="utf-8"><title>Checkout</title></head>
<body>
<h1>Checkout</h1>
<form method="POST" action="/checkout">
<input type="hidden" name="checkout_token" value="%s">
<label>Amount <input id="amount" name="amount" value="42.00"></label>
<button id="pay" type="submit">Pay</button>
</form>
</body></html>
`, hex.EncodeToString(b[:]))
}

// pay charges the form's checkout_token, taking chargeTime whatever the
// client does, then redirects to the receipt (POST/redirect/GET).
func (a *checkoutApp) pay(w http.ResponseWriter, r *http.Request) {
	token := r.PostFormValue("checkout_token")
	if token == "" {
		http.Error(w, "no checkout_token", http.StatusBadRequest)
		return
	}
	a.mu.Lock()
	a.inflight++
	a.charges = append(a.charges, charge{ID: len(a.charges) + 1, Token: token, Start: time.Now()})
	i := len(a.charges) - 1
	a.mu.Unlock()

	time.Sleep(chargeTime) // deliberately not watching r.Context()

	a.mu.Lock()
	a.charges[i].End = time.Now()
	a.inflight--
	id := a.charges[i].ID
	a.mu.Unlock()
	http.Redirect(w, r, "/receipt?id="+strconv.Itoa(id), http.StatusSeeOther)
}

func (a *checkoutApp) receipt(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	fmt.Fprintf(w, `<!doctype html>
<html><head><meta charset="utf-8"><title>Receipt</title></head>
<body><h1>Payment received</h1><p>Receipt #<span id="receipt">%s</span></p></body></html>
`, html.EscapeString(r.URL.Query().Get("id")))
}

// chargesOf returns the charges of token, in the order they started.
func (a *checkoutApp) chargesOf(token string) []charge {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []charge
	for _, c := range a.charges {
		if c.Token == token {
			out = append(out, c)
		}
	}
	return out
}

// rendered is how many forms GET /checkout has rendered.
func (a *checkoutApp) rendered() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.renders
}

// waitIdle waits until no charge has been under way for 200ms: a POST the
// browser cancelled still runs to its end at the backend.
func (a *checkoutApp) waitIdle(ctx context.Context) error {
	var idleSince time.Time
	for {
		a.mu.Lock()
		n := a.inflight
		a.mu.Unlock()
		switch {
		case n > 0:
			idleSince = time.Time{}
		case idleSince.IsZero():
			idleSince = time.Now()
		case time.Since(idleSince) >= 200*time.Millisecond:
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d charges still under way: %w", n, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// overlapping reports whether two of the charges ran at the same time.
func overlapping(cs []charge) bool {
	for i := range cs {
		for j := i + 1; j < len(cs); j++ {
			if cs[i].Start.Before(cs[j].End) && cs[j].Start.Before(cs[i].End) {
				return true
			}
		}
	}
	return false
}

// describe lists charges as "#id start+duration" relative to the first.
func describe(cs []charge) string {
	if len(cs) == 0 {
		return "none"
	}
	parts := make([]string, len(cs))
	for i, c := range cs {
		d := "running"
		if !c.End.IsZero() {
			d = c.End.Sub(c.Start).Round(time.Millisecond).String()
		}
		parts[i] = fmt.Sprintf("#%d at +%s for %s", c.ID, c.Start.Sub(cs[0].Start).Round(time.Millisecond), d)
	}
	return strings.Join(parts, ", ")
}
