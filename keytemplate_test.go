package redislock

import (
	"net/http/httptest"
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
	repl.Map(jsonProvider(body))

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
		got, missing, err := tmpl.expand(repl)
		if err != nil || got != tt.want || missing != tt.missing {
			t.Errorf("expand(%q) = %q, missing %v, err %v; want %q, missing %v", tt.tmpl, got, missing, err, tt.want, tt.missing)
		}
	}
	if parseTemplate("{http.request.header.X}").usesJSON || !parseTemplate("a{http.redis_lock.json.x}").usesJSON {
		t.Error("usesJSON must be true exactly for templates with JSON placeholders")
	}
}
