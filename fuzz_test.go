package redislock

import (
	"encoding/json"
	"errors"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// FuzzCaddyfile: any Caddyfile text parses to a handler or to an error, and
// a parsed handler validates or fails; never a panic or a hang.
func FuzzCaddyfile(f *testing.F) {
	files, _ := filepath.Glob("testdata/adapt/*.caddyfile")
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		// The directive's part: from redis_lock to the end of its block.
		s := string(b)
		if i := strings.Index(s, "redis_lock"); i >= 0 {
			f.Add(s[i:])
		}
	}
	f.Add("redis_lock k {\n redis {\n tls {\n ca x\n }\n }\n idempotency {\n fingerprint header\n }\n}")
	f.Fuzz(func(t *testing.T, input string) {
		d := caddyfile.NewTestDispenser(input)
		var h Handler
		if err := h.UnmarshalCaddyfile(d); err != nil {
			return
		}
		h.applyDefaults()
		_ = h.Validate()
		parseTemplate(h.Key)
		parseTemplate(h.Scope)
	})
}

// FuzzJSONKey: any body and path give a key, an ambiguity or a parse error,
// never a panic; a string the key reads is what encoding/json reads at that
// path; and numbers that are one double are one key.
func FuzzJSONKey(f *testing.F) {
	f.Add([]byte(`{"order_id":"o-1","amount":10.50,"items":[{"sku":"a"}]}`), "items.0.sku")
	f.Add([]byte(`{"order_id":"zz","ORDER_ID":"q"}`), "order_id")
	f.Add([]byte(`{"order_id":1e3}`), "order_id")
	f.Add([]byte(`{"a":{"b":[1,{"c":null}]}}`), "a.b.1.c")
	f.Add([]byte(`[[[[[[[[[[1]]]]]]]]]]`), "0.0.0")
	f.Add([]byte(`{"\u212aey":"x","k\u0065y":"y"}`), "key")
	f.Add([]byte("{\"s\":\"\xff\xfe\"}"), "s")
	f.Fuzz(func(t *testing.T, body []byte, path string) {
		v, err := parseJSON(body)
		if err != nil {
			if !errors.Is(err, errInvalidJSON) {
				t.Fatalf("parse error %v is not errInvalidJSON", err)
			}
			return
		}
		got, err := jsonField(v, path)
		if err != nil {
			if !errors.Is(err, errAmbiguousJSON) {
				t.Fatalf("field error %v is not errAmbiguousJSON", err)
			}
			return
		}
		// Differential check against encoding/json for string values.
		var std any
		if json.Unmarshal(body, &std) != nil {
			t.Fatalf("parseJSON accepted what encoding/json rejects: %q", body)
		}
		if s, ok := walkStd(std, path); ok && s != got {
			t.Fatalf("path %q: key reads %q, encoding/json %q (body %q)", path, got, s, body)
		}
		// The key text as a template value expands without error.
		r := httptest.NewRequest("POST", "/", nil)
		repl := caddyhttp.NewTestReplacer(r)
		fields, err := jsonFields(v, []string{path})
		if err != nil {
			t.Fatalf("jsonFields: %v after jsonField succeeded", err)
		}
		repl.Map(fields)
		if _, _, err := parseTemplate("k:{"+jsonPrefix+path+"}").expand(repl, nil); err != nil && !strings.ContainsAny(path, "{}\\") {
			t.Fatalf("expand: %v", err)
		}
	})
}

// walkStd follows path through encoding/json's decoding to a string value.
func walkStd(v any, path string) (string, bool) {
	for seg := range strings.SplitSeq(path, ".") {
		switch x := v.(type) {
		case map[string]any:
			v = x[seg]
		case []any:
			i, ok := arrayIndex(seg)
			if !ok || i >= len(x) {
				return "", false
			}
			v = x[i]
		default:
			return "", false
		}
	}
	s, ok := v.(string)
	return s, ok
}

// FuzzFormKey: reading a key field from any form body never panics; a
// field it accepts is what url.ParseQuery reads, and no other field of the
// body folds onto it.
func FuzzFormKey(f *testing.F) {
	f.Add("order_id=o-1&amount=10", "order_id")
	f.Add("order_id=a&order_id=b", "order_id")
	f.Add("order.id=a&order_id=b", "order_id")
	f.Add("metadata%5Border_id%5D=m&x=1", "metadata[order_id]")
	f.Add("a=%zz", "a")
	f.Add("a=1;b=2", "a")
	f.Fuzz(func(t *testing.T, body, name string) {
		r := httptest.NewRequest("POST", "/", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		vals, err := parseForm(r, []byte(body))
		if err != nil {
			if !errors.Is(err, errNotForm) {
				t.Fatalf("parse error %v is not errNotForm", err)
			}
			return
		}
		got, err := formField(vals, name)
		if err != nil {
			if !errors.Is(err, errAmbiguousForm) {
				t.Fatalf("field error %v is not errAmbiguousForm", err)
			}
			return
		}
		std, _ := url.ParseQuery(body)
		if got != std.Get(name) || len(std[name]) > 1 {
			t.Fatalf("field %q: key reads %q, url.ParseQuery %q", name, got, std[name])
		}
		for other := range std {
			if other != name && phpName(other) == phpName(name) {
				t.Fatalf("field %q accepted beside %q, which a backend reads as it", name, other)
			}
		}
	})
}
