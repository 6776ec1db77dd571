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
		"amount":          "10.5", // by value
		"big":             "1.2345678901234567e+19",
		"exp":             "1000",
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
		if got, err := jsonField(v, path); got != want || err != nil {
			t.Errorf("jsonField(%q) = %q, %v; want %q", path, got, err, want)
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

// Numbers are compared by value, as a backend reading them as doubles
// would: every spelling of one value gives one key.
func TestJSONNumbersByValue(t *testing.T) {
	for _, group := range [][]string{
		{"1000", "1e3", "1000.0", "1E+3", "10000e-1", "1000.000000000000000001"},
		{"0", "-0", "0.0", "0e10"},
		{"-12.5", "-1.25e1", "-125e-1"},
		{"9007199254740993", "9007199254740992"}, // one double
	} {
		var first string
		for i, lit := range group {
			v, err := parseJSON([]byte(`{"id":` + lit + `}`))
			if err != nil {
				t.Fatal(err)
			}
			got, err := jsonField(v, "id")
			if err != nil {
				t.Fatal(err)
			}
			if i == 0 {
				first = got
			} else if got != first {
				t.Errorf("%s reads as %q, %s as %q: want one key", group[0], first, lit, got)
			}
		}
	}
}

// A key field named twice, or in another letter case, is ambiguous: Go's
// encoding/json matches names case-insensitively and keeps the last one.
func TestJSONAmbiguousNames(t *testing.T) {
	tests := []struct {
		body, path string
		ambiguous  bool
	}{
		{`{"order_id":"zz","ORDER_ID":"q"}`, "order_id", true},
		{`{"order_id":"zz","order_id":"q"}`, "order_id", true},
		{`{"ORDER_ID":"q"}`, "order_id", true},
		{`{"order_\u0069d":"a","order_id":"b"}`, "order_id", true},
		{`{"\u212aey":"a"}`, "key", true}, // the Kelvin sign folds to k
		{`{"c":{"id":1,"ID":2}}`, "c.id", true},
		{`{"c":{"id":1,"ID":2}}`, "c", true}, // a whole object as the key
		{`{"order_id":"a","other":1,"other":2}`, "order_id", false},
		{`{"items":[{"sku":"a","SKU":"b"}]}`, "items.0.sku", true},
		{`{"items":[{"sku":"a"},{"sku":"b","SKU":"c"}]}`, "items.0.sku", false},
	}
	for _, tt := range tests {
		v, err := parseJSON([]byte(tt.body))
		if err != nil {
			t.Fatalf("%s: %v", tt.body, err)
		}
		_, err = jsonField(v, tt.path)
		if got := errors.Is(err, errAmbiguousJSON); got != tt.ambiguous {
			t.Errorf("%s at %s: ambiguous = %v (%v), want %v", tt.body, tt.path, got, err, tt.ambiguous)
		}
	}
}

// readJSONBody reads and parses r's body as the handler does for a JSON key.
func readJSONBody(r *http.Request, max int64) (*jsonValue, error) {
	b, err := readBody(r, max)
	if err != nil {
		return nil, err
	}
	return parseJSON(b)
}

// readBody leaves a body of length 0 unread, whatever wraps it (Caddy wraps
// an absent one), and puts a read body back for the next handler and for
// GetBody, also when its length is unknown (chunked).
func TestReadBody(t *testing.T) {
	wrapped := io.NopCloser(strings.NewReader(""))
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Body, r.ContentLength = wrapped, 0
	if b, err := readBody(r, 100); err != nil || b != nil {
		t.Fatalf("length 0: %q, %v", b, err)
	}
	if r.Body != wrapped || r.GetBody != nil {
		t.Fatal("length 0: the body was replaced")
	}
	for _, length := range []int64{3, -1} {
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader("abc"))
		r.ContentLength = length
		b, err := readBody(r, 100)
		if err != nil || string(b) != "abc" {
			t.Fatalf("length %d: %q, %v", length, b, err)
		}
		for _, body := range []func() (io.ReadCloser, error){func() (io.ReadCloser, error) { return r.Body, nil }, r.GetBody} {
			rc, err := body()
			if err != nil {
				t.Fatal(err)
			}
			if got, _ := io.ReadAll(rc); string(got) != "abc" {
				t.Fatalf("length %d: the next handler reads %q", length, got)
			}
		}
	}
}
