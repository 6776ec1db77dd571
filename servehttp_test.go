package redislock

// Tests of ServeHTTP called directly, with a provisioned Handler and a real
// redis-server but no Caddy server around it: the release order against the
// response, lost locks, Redis down, and what reaches the next handler.

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// unitHandler provisions a handler against the redis-server at addr.
func unitHandler(t *testing.T, addr string, modify func(*Handler)) *Handler {
	t.Helper()
	h := &Handler{Key: "{http.request.header.Idempotency-Key}", Redis: &RedisConfig{Addresses: []string{addr}}}
	if modify != nil {
		modify(h)
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	if err := h.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Cleanup() })
	if err := h.Validate(); err != nil {
		t.Fatal(err)
	}
	return h
}

// unitRequest is a request as Caddy hands it to a handler: with a replacer.
func unitRequest(method, key, body string) (*http.Request, *caddy.Replacer) {
	r := httptest.NewRequest(method, "/checkout", strings.NewReader(body))
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	return r, caddyhttp.NewTestReplacer(r)
}

func counterValue(t *testing.T, c interface{ Write(*dto.Metric) error }) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
