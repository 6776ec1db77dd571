package main

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestLedgerFlagsDoubleCharges(t *testing.T) {
	l := NewLedger(100 * time.Millisecond)
	// Concurrent duplicates are all charged.
	var wg sync.WaitGroup
	results := make(chan ChargeResult, 5)
	for range 5 {
		wg.Go(func() {
			res, err := l.Charge("o1", 0)
			if err != nil {
				t.Error(err)
			}
			results <- res
		})
	}
	wg.Wait()
	close(results)
	doubles := 0
	for r := range results {
		if r.Status != "charged" {
			t.Errorf("concurrent duplicate: status %q, want charged", r.Status)
		}
		if r.DoubleCharge {
			doubles++
		}
	}
	if doubles != 4 {
		t.Errorf("%d replies flagged double_charge, want 4", doubles)
	}
	// A late duplicate, after the charges have finished, is charged again:
	// the ledger has no idempotency of its own.
	res, err := l.Charge("o1", 0)
	if err != nil || res.Status != "charged" || res.Charge != 6 || !res.DoubleCharge {
		t.Fatalf("late duplicate: %+v, %v; want charged for the 6th time", res, err)
	}
	if _, err := l.Charge("o2", 0); err != nil {
		t.Fatal(err)
	}
	got := l.Stats([]string{"o1", "o2", "unknown"})
	want := LedgerStats{Orders: 2, Charges: 7, DoubleCharges: 5}
	if got != want {
		t.Errorf("Stats = %+v, want %+v", got, want)
	}
}

func TestLedgerRejectsLowerFencingToken(t *testing.T) {
	l := NewLedger(0)
	if res, err := l.Charge("o1", 10); err != nil || res.Status != "charged" || res.FencingToken != "10" {
		t.Fatalf("first charge: %+v, %v", res, err)
	}
	// A superseded holder (lower token) is refused, before any charge.
	if _, err := l.Charge("o1", 9); !errors.Is(err, ErrStaleFence) {
		t.Fatalf("lower token: err %v, want ErrStaleFence", err)
	}
	// The same holder again, and a newer one, are let in (and charge again).
	for _, f := range []int64{10, 11} {
		if res, err := l.Charge("o1", f); err != nil || res.Status != "charged" {
			t.Fatalf("token %d: %+v, %v; want charged", f, res, err)
		}
	}
	if _, err := l.Charge("o1", 10); !errors.Is(err, ErrStaleFence) {
		t.Fatalf("token 10 after 11: err %v, want ErrStaleFence", err)
	}
	// Tokens are per order; a request without one is accepted (plain route).
	if _, err := l.Charge("o2", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Charge("o1", 0); err != nil {
		t.Fatal(err)
	}
	// o1: tokens 10, 10, 11 and none; o2: token 1.
	if s := l.Stats([]string{"o1", "o2"}); s.StaleFences != 2 || s.Charges != 5 || s.DoubleCharges != 3 {
		t.Errorf("Stats = %+v, want 2 stale fences, 5 charges, 3 double charges", s)
	}
}

func TestBackendHTTP(t *testing.T) {
	srv := httptest.NewServer(NewLedger(0))
	defer srv.Close()
	post := func(key, fence, body string) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/charge", strings.NewReader(body))
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		if fence != "" {
			req.Header.Set("Fencing-Token", fence)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var m map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
			t.Fatalf("reply is not JSON: %v", err)
		}
		return resp.StatusCode, m
	}
	const body = `{"order_id":"o1","amount_cents":1299}`
	code, m := post("o1", "1796004498528085", body)
	if code != 200 || m["status"] != "charged" || m["fencing_token"] != "1796004498528085" {
		t.Fatalf("charge: %d %v; want 200 charged with the fencing token echoed", code, m)
	}
	if code, m = post("o1", "1", body); code != http.StatusPreconditionFailed || !strings.Contains(m["error"].(string), "fencing token") {
		t.Fatalf("stale token: %d %v; want 412 with a message", code, m)
	}
	if code, _ = post("o1", "abc", body); code != http.StatusBadRequest {
		t.Errorf("bad token: %d, want 400", code)
	}
	if code, _ = post("", "", `{"amount_cents":1}`); code != http.StatusBadRequest {
		t.Errorf("no key: %d, want 400", code)
	}
	if code, m = post("", "", `{"order_id":"o2"}`); code != 200 || m["order_id"] != "o2" {
		t.Errorf("order id from the body: %d %v", code, m)
	}
	if code, _ = post("o3", "", `not json`); code != http.StatusBadRequest {
		t.Errorf("bad body: %d, want 400", code)
	}
}
