package redislock

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestJSONField(t *testing.T) {
	req := httptest.NewRequest("POST", "/", strings.NewReader(`{
		"order_id": "o-1", "amount": 10.50, "big": 12345678901234567890, "exp": 1e3,
		"paid": true, "none": null, "empty": "",
		"customer": {"id": 42, "tags": ["a", "b"]},
		"items": [{"sku": "X-1"}, {"sku": "Y<2>"}],
		"obj": {"b": 1, "a": [1, 2]}
	}`))
	v, err := readJSONBody(req, 1<<10)
	if err != nil {
		t.Fatal(err)
	}
	tests := map[string]string{
		"order_id":        "o-1",
		"amount":          "10.50", // literal text, not 10.5
		"big":             "12345678901234567890",
		"exp":             "1e3",
		"paid":            "true",
		"none":            "",
		"empty":           "",
		"absent":          "",
		"customer.id":     "42",
		"customer.tags":   `["a","b"]`,
		"customer.tags.1": "b",
		"items.0.sku":     "X-1",
		"items.1.sku":     "Y<2>",
		"items.2.sku":     "",
		"items.x.sku":     "",
		"order_id.more":   "",
		"obj":             `{"a":[1,2],"b":1}`,
	}
	for path, want := range tests {
		if got := jsonField(v, path); got != want {
			t.Errorf("jsonField(%q) = %q, want %q", path, got, want)
		}
	}
}

func TestReadJSONBody(t *testing.T) {
	const doc = `{"order_id":"o-1"}`
	tests := []struct {
		name, body string
		max        int64
		want       error
	}{
		{"ok", doc, 64, nil},
		{"exactly max", doc, int64(len(doc)), nil},
		{"one over max", doc, int64(len(doc)) - 1, errBodyTooLarge},
		{"not json", "order_id=o-1", 64, errInvalidJSON},
		{"empty", "", 64, errInvalidJSON},
		{"trailing data", doc + " {}", 64, errInvalidJSON},
		{"truncated", `{"order_id":`, 64, errInvalidJSON},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := httptest.NewRequest("POST", "/", strings.NewReader(tt.body))
			_, err := readJSONBody(req, tt.max)
			if !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			if err != nil {
				return
			}
			// The body is handed on intact, and can be re-read for retries.
			for range 2 {
				b, _ := io.ReadAll(req.Body)
				if string(b) != tt.body || req.ContentLength != int64(len(tt.body)) {
					t.Fatalf("body handed on = %q (length %d), want %q", b, req.ContentLength, tt.body)
				}
				if req.Body, err = req.GetBody(); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

func TestReadJSONBodyMaxBytesError(t *testing.T) {
	// request_body max_size before redis_lock: its limit is a 413 too.
	req := httptest.NewRequest("POST", "/", strings.NewReader(`{"order_id":"o-1"}`))
	req.Body = http.MaxBytesReader(httptest.NewRecorder(), req.Body, 4)
	if _, err := readJSONBody(req, 1024); !errors.Is(err, errBodyTooLarge) {
		t.Fatalf("err = %v, want errBodyTooLarge", err)
	}
}
