package main

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// execution is one request that reached the backend: the record the checks
// run on. Its times are this process's clock, as are the clients' and the
// faults', so they compare.
type execution struct {
	ID       string // ex_000001: also in the body the backend answers
	Key      string // Idempotency-Key as the backend saw it; with an account, accountKey(account, it)
	Account  string // X-Account as the backend saw it; "" without accounts
	Node     int    // the Caddy node that sent it (X-Chaos-Node)
	FenceRaw string // the Fencing-Token header as sent
	Fence    int64  // parsed; 0 when absent or not a positive integer
	Start    time.Time
	End      time.Time
	Large    bool   // asked for the receipt: a large answer
	Status   int    // what it answered; 0 when it dropped the connection instead
	Body     []byte // the exact bytes it answered; nil when dropped
	WriteErr string // the answer could not be written (the node was gone)
	// Concurrent are the executions of the same account in progress when
	// this one began: two requests of one account at once.
	Concurrent []string
}

// behaviour is what the backend does for one execution, decided from the
// seed, the key and how many times the key ran before, so that a run is
// repeatable in what it asks of the proxy.
type behaviour struct {
	Delay  time.Duration
	Status int  // 200, 402 (card declined) or 503 (not processed, first run only)
	Drop   bool // the charge is made, then the connection closed without an answer
}

// maxBackendDelay bounds every execution: shorter than two thirds of the
// shortest lease the scenarios use, so that an execution whose Caddy node
// died ends before the node's lock expires.
func maxBackendDelay(ttl time.Duration) time.Duration { return ttl / 2 }

func behaviourFor(seed uint64, key string, nth int, ttl time.Duration) behaviour {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%s/%d", seed, key, nth)
	rng := rand.New(rand.NewPCG(seed, h.Sum64()))
	maxDelay := maxBackendDelay(ttl)
	b := behaviour{Status: http.StatusOK}
	switch p := rng.Float64(); {
	case p < 0.65:
		b.Delay = time.Duration(20+rng.IntN(200)) * time.Millisecond
	case p < 0.9:
		b.Delay = maxDelay/2 + time.Duration(rng.Int64N(int64(maxDelay/4)))
	default:
		b.Delay = maxDelay*9/10 + time.Duration(rng.Int64N(int64(maxDelay/10)))
	}
	switch p := rng.Float64(); {
	case p < 0.08:
		b.Status = http.StatusPaymentRequired
	case p < 0.12 && nth == 0:
		b.Status = http.StatusServiceUnavailable
	}
	b.Drop = rng.Float64() < 0.02
	return b
}

// backend is a payment API that records every execution and answers as
// Stripe does: a charge object, or an error object, as JSON. It has no
// idempotency of its own, and it does not stop a charge whose caller went
// away.
type backend struct {
	Addr string
	seed uint64
	ttl  time.Duration

	mu       sync.Mutex
	execs    []*execution
	runs     map[string]int      // executions per key so far
	inFlight map[int]int         // executions in progress per node
	accounts map[string][]string // executions in progress per account

	srv  *http.Server
	done chan struct{}
}

func startBackend(seed uint64, ttl time.Duration) (*backend, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("backend: %w", err)
	}
	b := &backend{Addr: ln.Addr().String(), seed: seed, ttl: ttl,
		runs: map[string]int{}, inFlight: map[int]int{}, accounts: map[string][]string{}, done: make(chan struct{})}
	b.srv = &http.Server{Handler: b, ReadHeaderTimeout: 5 * time.Second,
		// Idle connections are closed now and then, so that the proxy's
		// pool meets closed keep-alive connections as it does in production.
		IdleTimeout: 700 * time.Millisecond}
	go func() {
		defer close(b.done)
		_ = b.srv.Serve(ln)
	}()
	return b, nil
}

func (b *backend) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = b.srv.Shutdown(ctx)
	<-b.done
}

// chargeParams is the body clients send to POST /v1/charges.
type chargeParams struct {
	Amount      int    `json:"amount"`
	Currency    string `json:"currency"`
	Source      string `json:"source"`
	Description string `json:"description"`
}

func (b *backend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	raw, err := io.ReadAll(r.Body)
	if err != nil {
		return // the node went away while sending: nothing was charged
	}
	var params chargeParams
	_ = json.Unmarshal(raw, &params)
	node, _ := strconv.Atoi(r.Header.Get("X-Chaos-Node"))
	e := &execution{Key: accountKey(r.Header.Get(accountHeader), r.Header.Get(idempotencyHeader)),
		Account: r.Header.Get(accountHeader), Node: node,
		FenceRaw: r.Header.Get("Fencing-Token"), Start: time.Now(), Large: r.URL.Query().Get("expand[]") == "receipt"}
	if f, err := strconv.ParseInt(e.FenceRaw, 10, 64); err == nil && f > 0 {
		e.Fence = f
	}
	b.mu.Lock()
	nth := b.runs[e.Key]
	b.runs[e.Key]++
	e.ID = fmt.Sprintf("ex_%06d", len(b.execs)+1)
	b.execs = append(b.execs, e)
	b.inFlight[node]++
	if e.Account != "" {
		// Another request of the account in progress: the account's lock
		// let two run at once (checkAccount says whether a window excuses it).
		e.Concurrent = slices.Clone(b.accounts[e.Account])
		b.accounts[e.Account] = append(b.accounts[e.Account], e.ID)
	}
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		b.inFlight[node]--
		if e.Account != "" {
			b.accounts[e.Account] = slices.DeleteFunc(b.accounts[e.Account], func(id string) bool { return id == e.ID })
		}
		e.End = time.Now()
		b.mu.Unlock()
	}()

	bh := behaviourFor(b.seed, e.Key, nth, b.ttl)
	time.Sleep(bh.Delay) // the card network: not cancelled with the request

	if bh.Drop {
		// Charged, and the answer lost: the connection breaks before a byte
		// of it is written.
		if hj, ok := w.(http.Hijacker); ok {
			if c, _, err := hj.Hijack(); err == nil {
				_ = c.Close()
				return
			}
		}
		panic(http.ErrAbortHandler)
	}
	body := chargeBody(e, bh.Status, params)
	if e.Large && bh.Status == http.StatusOK {
		body = withReceipt(body, e)
	}
	b.mu.Lock()
	e.Status, e.Body = bh.Status, body
	b.mu.Unlock()
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("Request-Id", "req_"+e.ID[3:])
	w.WriteHeader(bh.Status)
	if _, err := w.Write(body); err != nil {
		b.mu.Lock()
		e.WriteErr = err.Error()
		b.mu.Unlock()
	}
}

// chargeBody is the answer of execution e, which names it: a replay that
// names e must be these bytes.
func chargeBody(e *execution, status int, p chargeParams) []byte {
	var v any
	switch status {
	case http.StatusOK:
		v = map[string]any{
			"id": "ch_" + e.ID[3:], "object": "charge", "amount": p.Amount, "currency": p.Currency,
			"status": "succeeded", "paid": true, "description": p.Description,
			"created": e.Start.Unix(), "execution_id": e.ID, "fencing_token": e.FenceRaw,
		}
	case http.StatusPaymentRequired:
		v = map[string]any{
			"error": map[string]any{"type": "card_error", "code": "card_declined",
				"decline_code": "insufficient_funds", "message": "Your card has insufficient funds.",
				"charge": "ch_" + e.ID[3:]},
			"execution_id": e.ID, "fencing_token": e.FenceRaw,
		}
	default:
		v = map[string]any{
			"error": map[string]any{"type": "api_error", "code": "processing_unavailable",
				"message": "The card network is unavailable; nothing was charged. Retry."},
			"execution_id": e.ID, "fencing_token": e.FenceRaw,
		}
	}
	body, _ := json.Marshal(v)
	return append(body, '\n')
}

// largeAnswer is about the size of a charge's answer with its receipt:
// the network phase's slow link (96 KB/s) takes 1.7s to carry it, more
// than what is left of a 2s lease after its last renewal (every ttl/3);
// less than the plugin's default max_response (1MiB), so that it is stored.
const largeAnswer = 160 << 10

// withReceipt adds a receipt to a charge's answer, naming e on every line,
// so that it is about largeAnswer bytes and its bytes are e's alone.
func withReceipt(body []byte, e *execution) []byte {
	var receipt strings.Builder
	for n := 0; receipt.Len() < largeAnswer-len(body)-64; n++ {
		fmt.Fprintf(&receipt, "%s receipt line %05d: 1 x charge, card ending 4242, authorised;", e.ID, n)
	}
	var v map[string]any
	if err := json.Unmarshal(body, &v); err != nil {
		return body
	}
	v["receipt"] = receipt.String()
	out, _ := json.Marshal(v)
	return append(out, '\n')
}

// accountKey is the key the records and the checks know a payment by: its
// idempotency key, within its account when it has one ("acct_3/pay_00012"):
// two accounts may use the same idempotency key for two payments.
func accountKey(account, key string) string {
	if account == "" {
		return key
	}
	return account + "/" + key
}

// executions returns a copy of the records, in the order they began.
func (b *backend) executions() []execution {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]execution, len(b.execs))
	for i, e := range b.execs {
		out[i] = *e
	}
	return out
}

// busy returns how many executions are in progress, on node or, with
// node < 0, on every node.
func (b *backend) busy(node int) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if node >= 0 {
		return b.inFlight[node]
	}
	n := 0
	for _, v := range b.inFlight {
		n += v
	}
	return n
}
