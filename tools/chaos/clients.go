package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// keyPlan is one payment: its Idempotency-Key, the body every attempt
// sends byte for byte, when it starts, and the SDK clients that send it
// (a double click, a queue's redelivery, a late retry by a job).
type keyPlan struct {
	Key     string // what the records and the checks know it by: accountKey(Account, IdemKey)
	IdemKey string // the Idempotency-Key header
	Account string // the X-Account header; "" without accounts
	Path    string // /v1/charges, or with ?expand[]=receipt for a large answer
	Body    []byte
	At      time.Duration // after the traffic starts
	Clients []clientPlan
}

// clientPlan is one SDK instance sending a payment until it has a definite
// answer.
type clientPlan struct {
	Delay   time.Duration // after the key's start
	Timeout time.Duration // per attempt
	Patient bool          // its timeout is longer than any answer may take
	Late    bool          // sent after the first clients most likely had their answer
}

// Client behaviour, as payment SDKs do it (stripe-node, stripe-go).
const (
	patientTimeout = 15 * time.Second
	maxAttempts    = 40
	maxClientTime  = 60 * time.Second
	backoffBase    = 50 * time.Millisecond
	backoffCap     = time.Second
	retryAfterCap  = 2 * time.Second // Retry-After is honoured up to this
)

// The charge route, and the same asking for the receipt: a large answer
// (largeAnswer bytes).
const (
	chargePath      = "/v1/charges"
	largeChargePath = chargePath + "?expand[]=receipt"
)

// planKeys draws count payments spread over spread from rng; unless large
// is nil, a payment starting at at asks for a large answer with the
// chance large(at) (nothing more is drawn when it is nil, so that the
// other phases' plans stay as they were for a seed).
func planKeys(rng *rand.Rand, count int, spread, ttl time.Duration, large func(at time.Duration) float64) []keyPlan {
	maxDelay := maxBackendDelay(ttl)
	plans := make([]keyPlan, count)
	for i := range plans {
		kp := keyPlan{Key: fmt.Sprintf("pay_%05d", i+1), Path: chargePath, At: time.Duration(rng.Int64N(int64(spread)))}
		kp.IdemKey = kp.Key
		body, _ := json.Marshal(chargeParams{Amount: 100 + rng.IntN(100000), Currency: "usd",
			Source: "tok_visa", Description: "order " + kp.Key})
		kp.Body = body
		clients := 1
		switch p := rng.Float64(); {
		case p < 0.25:
			clients = 3
		case p < 0.85:
			clients = 2
		}
		for c := range clients {
			cp := clientPlan{Patient: true, Timeout: patientTimeout}
			if c > 0 {
				cp.Delay = time.Duration(rng.IntN(150)) * time.Millisecond
			}
			if rng.Float64() < 0.25 {
				// Gives up on an attempt before the slower answers come.
				cp.Patient = false
				cp.Timeout = maxDelay/4 + time.Duration(rng.Int64N(int64(maxDelay/2)))
			}
			kp.Clients = append(kp.Clients, cp)
		}
		if rng.Float64() < 0.4 {
			kp.Clients = append(kp.Clients, clientPlan{Patient: true, Timeout: patientTimeout, Late: true,
				Delay: 2*maxDelay + time.Duration(rng.Int64N(int64(3*time.Second)))})
		}
		if large != nil && rng.Float64() < large(kp.At) {
			kp.Path = largeChargePath
		}
		plans[i] = kp
	}
	return plans
}

// burstShare is the share of an account run's payments that start with the
// one before of their account, in a burst (a batch of payouts, a wallet's
// double spend): different keys of one account at once. burstGap bounds
// how long after.
const (
	burstShare = 0.3
	burstGap   = 300 * time.Millisecond
)

// onAccounts puts plans on accounts accounts (acct_1, ...), each keyed
// within its account: acct_1's keys are pay_00001, pay_00002, ... as are
// every other account's, so that the same idempotency key names a payment
// of each account (two records that must never meet). A share of the
// payments (burstShare) start with the payment before them, of the same
// account, up to burstGap later; the others are on an account drawn at
// random. The draws are from a source of their own, so that the seed's
// faults and payments stay the same as without accounts.
func onAccounts(seed uint64, plans []keyPlan, accounts int, spread time.Duration) {
	rng := rand.New(rand.NewPCG(seed, 0x6163636f756e7473)) // "accounts"
	perAccount := map[string]int{}
	for i := range plans {
		kp := &plans[i]
		if i > 0 && rng.Float64() < burstShare {
			prev := plans[i-1]
			kp.Account = prev.Account
			kp.At = min(prev.At+time.Duration(rng.Int64N(int64(burstGap))), spread)
		} else {
			kp.Account = fmt.Sprintf("acct_%d", 1+rng.IntN(accounts))
		}
		perAccount[kp.Account]++
		kp.IdemKey = fmt.Sprintf("pay_%05d", perAccount[kp.Account])
		kp.Key = accountKey(kp.Account, kp.IdemKey)
		var params chargeParams
		if json.Unmarshal(kp.Body, &params) == nil {
			params.Description = "order " + kp.Key
			kp.Body, _ = json.Marshal(params)
		}
	}
}

// attempt is one request a client sent, and what it got.
type attempt struct {
	Key        string
	Client     int
	N          int // 0: the first
	Node       int
	Patient    bool
	Start, End time.Time
	Status     int    // 0 when Err
	Err        string // timeout, refused, reset, cut short
	Replayed   bool   // Idempotent-Replayed: true
	Body       []byte
	Problem    string // the problem type's slug, for the plugin's problem+json
	ExecID     string // execution_id in the body: the backend's answer, or its replay
	RetryAfter time.Duration
}

// definite is an answer a payment SDK stops at.
func (a attempt) definite() bool {
	switch {
	case a.Err != "":
		return false
	case a.Status == http.StatusConflict:
		return false
	case a.Status == http.StatusBadGateway && a.Problem == "outcome-unknown":
		return true
	case a.Status >= 500:
		return false
	}
	return true
}

// delivered is an answer that, once a client has it, the key must not run
// again for: the backend's answer (unless it said "not processed"), a
// replay, or the outcome-unknown problem that stands for a lost answer.
func (a attempt) delivered() bool {
	switch {
	case a.Err != "":
		return false
	case a.Replayed:
		return true
	case a.ExecID != "":
		return !notProcessed(a.Status)
	}
	return a.Status == http.StatusBadGateway && a.Problem == "outcome-unknown"
}

// notProcessed are the statuses the plugin does not store: "try again".
func notProcessed(status int) bool {
	switch status {
	case http.StatusRequestTimeout, http.StatusTooEarly, http.StatusTooManyRequests, http.StatusServiceUnavailable:
		return true
	}
	return false
}

// clientResult is one client's attempts.
type clientResult struct {
	Key      string
	Client   int
	Plan     clientPlan
	Attempts []attempt
	Definite bool
	Took     time.Duration
}

// traffic runs every client of plans against nodes from t0 on.
type traffic struct {
	seed  uint64
	nodes []string // base URLs
	http  *http.Client

	mu      sync.Mutex
	results []clientResult
}

func newTraffic(seed uint64, nodes []string) *traffic {
	tr := &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 30 * time.Second, DisableCompression: true}
	return &traffic{seed: seed, nodes: nodes, http: &http.Client{Transport: tr}}
}

// run starts each client at its time and returns when all have finished.
func (t *traffic) run(ctx context.Context, t0 time.Time, plans []keyPlan) []clientResult {
	var wg sync.WaitGroup
	for _, kp := range plans {
		for ci, cp := range kp.Clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Until(t0.Add(kp.At + cp.Delay))):
				}
				res := t.client(ctx, kp, ci, cp)
				t.mu.Lock()
				t.results = append(t.results, res)
				t.mu.Unlock()
			}()
		}
	}
	wg.Wait()
	t.http.CloseIdleConnections()
	return t.results
}

// client sends kp until it gets a definite answer: the same key and body
// every time, to a node picked at random (a load balancer), retrying after
// a 409, a 5xx, a timeout or a broken connection with exponential backoff
// and jitter, waiting at least Retry-After (up to retryAfterCap).
func (t *traffic) client(ctx context.Context, kp keyPlan, ci int, cp clientPlan) clientResult {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s/%d", kp.Key, ci)
	rng := rand.New(rand.NewPCG(t.seed, h.Sum64()))
	res := clientResult{Key: kp.Key, Client: ci, Plan: cp}
	start := time.Now()
	for n := 0; n < maxAttempts && time.Since(start) < maxClientTime && ctx.Err() == nil; n++ {
		a := t.attempt(ctx, kp, ci, cp, n, rng.IntN(len(t.nodes)))
		res.Attempts = append(res.Attempts, a)
		if a.definite() {
			res.Definite = true
			break
		}
		sleep := min(backoffBase<<min(n, 10), backoffCap)
		sleep = sleep/2 + time.Duration(rng.Int64N(int64(sleep/2)+1))
		sleep = max(sleep, min(a.RetryAfter, retryAfterCap))
		select {
		case <-ctx.Done():
		case <-time.After(sleep):
		}
	}
	res.Took = time.Since(start)
	return res
}

func (t *traffic) attempt(ctx context.Context, kp keyPlan, ci int, cp clientPlan, n, node int) attempt {
	a := attempt{Key: kp.Key, Client: ci, N: n, Node: node, Patient: cp.Patient, Start: time.Now()}
	actx, cancel := context.WithTimeout(ctx, cp.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(actx, http.MethodPost, t.nodes[node]+kp.Path, bytes.NewReader(kp.Body))
	if err != nil {
		a.Err, a.End = err.Error(), time.Now()
		return a
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idempotencyHeader, kp.IdemKey)
	if kp.Account != "" {
		req.Header.Set(accountHeader, kp.Account)
	}
	req.Header.Set("User-Agent", "chaos-sdk/1.0")
	resp, err := t.http.Do(req)
	if err != nil {
		a.Err, a.End = errText(err), time.Now()
		return a
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	a.End = time.Now()
	if err != nil {
		a.Err = "reading the body: " + errText(err) // cut short: no answer
		return a
	}
	a.Status, a.Body = resp.StatusCode, body
	a.Replayed = resp.Header.Get("Idempotent-Replayed") == "true"
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
		a.RetryAfter = time.Duration(s) * time.Second
	}
	var fields struct {
		Type        string `json:"type"`
		ExecutionID string `json:"execution_id"`
	}
	if json.Unmarshal(body, &fields) == nil {
		a.ExecID = fields.ExecutionID
		if i := strings.LastIndexByte(fields.Type, '#'); i >= 0 {
			a.Problem = fields.Type[i+1:]
		}
	}
	return a
}

func errText(err error) string {
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return "timeout"
	}
	return err.Error()
}
