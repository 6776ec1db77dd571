package redislock

// `idempotency { store ... }`: which answers are kept for retries, unit by
// unit and through Caddy against a real Redis.

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/reqlock/caddy-redis-lock/internal/redistest"
)

func TestStorePolicy(t *testing.T) {
	for _, tc := range []struct {
		store  []string
		stored []int
		not    []int
	}{
		{nil, []int{200, 201, 302, 400, 402, 409, 422, 500, 502}, []int{408, 425, 429, 503}},
		{[]string{"2xx"}, []int{200, 201, 204}, []int{302, 400, 402, 409, 500}},
		{[]string{"2xx", "409", "422"}, []int{200, 409, 422}, []int{400, 402, 500}},
		{[]string{"4xx", "503"}, []int{400, 402, 409, 503}, []int{200, 408, 425, 429, 500}},
		{[]string{"4XX", "429"}, []int{400, 429}, []int{408, 425, 200}},
	} {
		p, err := parseStorePolicy(tc.store)
		if err != nil {
			t.Fatalf("%v: %v", tc.store, err)
		}
		for _, s := range tc.stored {
			if !p.stores(s) {
				t.Errorf("store %v: %d not stored", tc.store, s)
			}
		}
		for _, s := range tc.not {
			if p.stores(s) {
				t.Errorf("store %v: %d stored", tc.store, s)
			}
		}
	}
}

// Through Caddy: an answer left out is not replayed and its retry runs
// again; one named is replayed, 503 included; outcome-unknown is stored
// whatever the policy.
func TestStorePolicyThroughCaddy(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	be := chargeBackend(t)
	sites := startCaddySites(t, siteOptions{},
		paySite(srv.Addr, be.URL, storedAnswers("store 2xx 409")),
		paySite(srv.Addr, be.URL, storedAnswers("store 4xx 503"), lockLines("prefix other:")))
	for _, tc := range []struct {
		site     int
		status   int
		replayed bool
	}{
		{0, 200, true}, {0, 409, true}, {0, 402, false}, {0, 500, false},
		{1, 402, true}, {1, 503, true}, {1, 429, false}, {1, 200, false},
	} {
		key := fmt.Sprintf("store-%d-%d", tc.site, tc.status)
		path := fmt.Sprintf("/pay/status/%d", tc.status)
		first := sites[tc.site].do("POST", path, `{}`, "Idempotency-Key", key)
		again := sites[tc.site].do("POST", path, `{}`, "Idempotency-Key", key)
		if first.Status != tc.status || again.Status != tc.status {
			t.Errorf("site %d, %d: answered %d then %d", tc.site, tc.status, first.Status, again.Status)
		}
		replayed := again.Header.Get(replayedHeader) == "true"
		runs := be.executions(key)
		switch {
		case tc.replayed && (!replayed || runs != 1 || again.Body != first.Body):
			t.Errorf("site %d, %d: want it stored and replayed; replayed=%v, %d runs", tc.site, tc.status, replayed, runs)
		case !tc.replayed && (replayed || runs != 2):
			t.Errorf("site %d, %d: want it not stored, the retry run; replayed=%v, %d runs", tc.site, tc.status, replayed, runs)
		}
	}
	// A backend that broke off: outcome-unknown, stored though 5xx is not.
	first := sites[0].do("POST", "/pay/reset", `{}`, "Idempotency-Key", "store-reset")
	again := sites[0].do("POST", "/pay/reset", `{}`, "Idempotency-Key", "store-reset")
	if p := expectProblem(t, again, http.StatusBadGateway); !strings.HasSuffix(p.Type, "#outcome-unknown") || again.Header.Get(replayedHeader) != "true" {
		t.Errorf("outcome-unknown under store 2xx 409: first %d, then %s", first.Status, again)
	}
	if n := be.executions("store-reset"); n != 1 {
		t.Errorf("the broken-off charge ran %d times, want 1", n)
	}
}
