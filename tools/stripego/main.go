// Command stripego drives stripe-go, Stripe's official Go SDK, against a
// Caddy site, for the plugin's sdk_go_test.go: what run.js does for
// stripe-node and run.py for stripe-python. It lives in the tools module so
// that stripe-go never enters the plugin's go.mod.
//
//	stripego <base URL> < cases.json
//
// cases.json: {"maxNetworkRetries": n, "timeoutMs": ms, "cases": [case, ...]},
// where a case is {"name", "account", "key", "params", "background",
// "awaitBackground", "pauseMs"}: a V1PaymentIntents.Create call with the
// Stripe-Account and Idempotency-Key given. timeoutMs is the HTTP client's
// timeout (default 30s). A background call runs in a goroutine the next case
// does not wait for; awaitBackground waits for every background call before
// this one starts; pauseMs waits after starting the case. Prints one JSON
// array, a result per case, in the order of the cases:
// {"name", "attempts", "ok", "status", "object": {...}, "replayed",
// "error": {...}}, where error.class is the typed error stripe-go picked
// (card_error, idempotency_error, invalid_request_error, api_error).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/stripe/stripe-go/v82"
)

type input struct {
	MaxNetworkRetries int64      `json:"maxNetworkRetries"`
	TimeoutMs         int        `json:"timeoutMs"`
	Cases             []callCase `json:"cases"`
}

type callCase struct {
	Name       string         `json:"name"`
	Account    string         `json:"account"`
	Key        string         `json:"key"`
	Params     map[string]any `json:"params"`
	Background bool           `json:"background"`
	Await      bool           `json:"awaitBackground"`
	PauseMs    int            `json:"pauseMs"`
}

type result struct {
	Name     string     `json:"name"`
	OK       bool       `json:"ok"`
	Attempts int        `json:"attempts"`
	Status   int        `json:"status,omitempty"`
	Replayed bool       `json:"replayed"`
	Object   *intent    `json:"object,omitempty"`
	Error    *raisedErr `json:"error,omitempty"`
	Failure  string     `json:"failure,omitempty"` // an error that is not a *stripe.Error
}

type intent struct {
	ID          string `json:"id"`
	Object      string `json:"object"`
	Amount      int64  `json:"amount"`
	Status      string `json:"status"`
	Description string `json:"description"`
}

type raisedErr struct {
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

// attempts counts every request stripe-go sends, retries included, by
// Idempotency-Key: what stripe-node's "request" event gives run.js.
type attempts struct {
	mu sync.Mutex
	n  map[string]int
}

func (a *attempts) RoundTrip(r *http.Request) (*http.Response, error) {
	a.mu.Lock()
	a.n[r.Header.Get("Idempotency-Key")]++
	a.mu.Unlock()
	return http.DefaultTransport.RoundTrip(r)
}

func (a *attempts) get(key string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n[key]
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: stripego <base URL> < cases.json")
		os.Exit(2)
	}
	var in input
	if err := json.NewDecoder(os.Stdin).Decode(&in); err != nil {
		fmt.Fprintln(os.Stderr, "reading cases:", err)
		os.Exit(1)
	}
	timeout := 30 * time.Second
	if in.TimeoutMs > 0 {
		timeout = time.Duration(in.TimeoutMs) * time.Millisecond
	}
	counter := &attempts{n: map[string]int{}}
	sc := stripe.NewClient("sk_test_caddy_redis_lock", stripe.WithBackends(stripe.NewBackendsWithConfig(&stripe.BackendConfig{
		URL:               stripe.String(os.Args[1]),
		HTTPClient:        &http.Client{Timeout: timeout, Transport: counter},
		MaxNetworkRetries: stripe.Int64(in.MaxNetworkRetries),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})))

	results := make([]result, len(in.Cases))
	var background sync.WaitGroup
	for i, c := range in.Cases {
		if c.Await {
			background.Wait()
		}
		if c.Background {
			background.Add(1)
			go func() {
				defer background.Done()
				results[i] = call(sc, counter, c)
			}()
		} else {
			results[i] = call(sc, counter, c)
		}
		time.Sleep(time.Duration(c.PauseMs) * time.Millisecond)
	}
	background.Wait()
	if err := json.NewEncoder(os.Stdout).Encode(results); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// call makes one PaymentIntents.Create and reads what stripe-go made of it.
func call(sc *stripe.Client, counter *attempts, c callCase) result {
	p := &stripe.PaymentIntentCreateParams{}
	if v, ok := c.Params["amount"].(float64); ok {
		p.Amount = stripe.Int64(int64(v))
	}
	if v, ok := c.Params["currency"].(string); ok {
		p.Currency = stripe.String(v)
	}
	if v, ok := c.Params["description"].(string); ok {
		p.Description = stripe.String(v)
	}
	p.SetIdempotencyKey(c.Key)
	p.SetStripeAccount(c.Account)
	before := counter.get(c.Key)
	pi, err := sc.V1PaymentIntents.Create(context.Background(), p)
	r := result{Name: c.Name, OK: err == nil, Attempts: counter.get(c.Key) - before}
	if err == nil {
		r.Status = pi.LastResponse.StatusCode
		r.Replayed = pi.LastResponse.Header.Get("Idempotent-Replayed") == "true"
		r.Object = &intent{ID: pi.ID, Object: pi.Object, Amount: pi.Amount, Status: string(pi.Status), Description: pi.Description}
		return r
	}
	var se *stripe.Error
	if !errors.As(err, &se) {
		r.Failure = fmt.Sprintf("%T: %v", err, err)
		return r
	}
	e := &raisedErr{
		RawType: string(se.Type), Code: string(se.Code), Message: se.Msg,
		DeclineCode: string(se.DeclineCode), Charge: se.ChargeID, StatusCode: se.HTTPStatusCode,
	}
	// The typed error stripe-go picks by the error's type.
	switch se.Err.(type) {
	case *stripe.CardError:
		e.Class = "card_error"
	case *stripe.IdempotencyError:
		e.Class = "idempotency_error"
	case *stripe.InvalidRequestError:
		e.Class = "invalid_request_error"
	case *stripe.APIError:
		e.Class = "api_error"
	}
	if se.LastResponse != nil {
		e.Replayed = se.LastResponse.Header.Get("Idempotent-Replayed") == "true"
		e.ShouldRetry = se.LastResponse.Header.Get("Stripe-Should-Retry")
	}
	r.Error = e
	return r
}
