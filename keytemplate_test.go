package redislock

import (
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func TestTemplateExpand(t *testing.T) {
	req := httptest.NewRequest("POST", "/orders?id=7", strings.NewReader(`{"order_id":"o-1","n":0,"e":""}`))
	req.Header.Set("Idempotency-Key", "abc")
	req.Header.Set("Empty", "")
	repl := caddyhttp.NewTestReplacer(req)
	body, err := readJSONBody(req, 1024)
	if err != nil {
		t.Fatal(err)
	}
	fields, err := jsonFields(body, nil)
	if err != nil {
		t.Fatal(err)
	}
	repl.Map(fields)

	tests := []struct {
		tmpl, want string
		missing    bool
	}{
		{"{http.request.header.Idempotency-Key}", "abc", false},
		{"literal", "literal", false},
		{"k:{http.request.header.Absent}", "k:", true},
		{"{http.request.header.Empty}", "", true},
		{"{http.request.uri.query.id}-{http.request.header.Idempotency-Key}", "7-abc", false},
		{"{http.request.uri.query.nope}-{http.request.header.Idempotency-Key}", "-abc", true},
		{"order:{http.redis_lock.json.order_id}", "order:o-1", false},
		{"order:{http.redis_lock.json.missing}", "order:", true},
		{"order:{http.redis_lock.json.e}", "order:", true},
		{"n:{http.redis_lock.json.n}", "n:0", false}, // zero is a value
		{"{no.such.placeholder}", "", true},
		{`\{literal\}`, "{literal}", false},
	}
	for _, tt := range tests {
		tmpl := parseTemplate(tt.tmpl)
		got, missing, err := tmpl.expand(repl, nil)
		if err != nil || got != tt.want || missing != tt.missing {
			t.Errorf("expand(%q) = %q, missing %v, err %v; want %q, missing %v", tt.tmpl, got, missing, err, tt.want, tt.missing)
		}
	}
	in := parseTemplate(`{http.request.header.x-a}{http.request.uri.query.q}\{http.request.header.Escaped\}` +
		`{http.request.cookie.c}{http.redis_lock.json.items.0.sku}{http.request.header.X-A}`).inputs
	want := keyInputs{headers: []string{"X-A"}, queries: []string{"q"}, cookies: []string{"c"}, jsonPaths: []string{"items.0.sku"}}
	if !reflect.DeepEqual(in, want) {
		t.Errorf("inputs = %+v, want %+v", in, want)
	}
}

// A value the key reads that the request carries twice is ambiguous: Caddy
// joins repeated headers ("K,zzz") and takes the first query value or
// cookie, a backend may take another.
func TestRepeatedInputs(t *testing.T) {
	in := parseTemplate("{http.request.header.Idempotency-Key}").inputs.merge(
		parseTemplate("{http.request.uri.query.tenant}:{http.request.cookie.session}").inputs)
	tests := []struct {
		name     string
		mod      func(r *http.Request)
		repeated bool
	}{
		{"each once", func(r *http.Request) {}, false},
		{"header twice", func(r *http.Request) { r.Header.Add("Idempotency-Key", "zzz") }, true},
		{"header twice, other case", func(r *http.Request) { r.Header["Idempotency-Key"] = append(r.Header["Idempotency-Key"], "zzz") }, true},
		{"one header with a comma", func(r *http.Request) { r.Header.Set("Idempotency-Key", "K,zzz") }, false},
		{"query twice", func(r *http.Request) { r.URL.RawQuery = "tenant=a&tenant=b" }, true},
		{"cookie twice", func(r *http.Request) { r.Header.Add("Cookie", "SESSION=b") }, true},
		{"another header twice", func(r *http.Request) { r.Header.Add("X-Other", "1"); r.Header.Add("X-Other", "2") }, false},
	}
	for _, tt := range tests {
		r := httptest.NewRequest("POST", "/pay?tenant=a", nil)
		r.Header.Set("Idempotency-Key", "K")
		r.Header.Set("Cookie", "session=a")
		tt.mod(r)
		if got := in.repeated(r); got != tt.repeated {
			t.Errorf("%s: repeated = %v, want %v", tt.name, got, tt.repeated)
		}
	}
}
