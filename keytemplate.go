package redislock

import (
	"net/http"
	"net/textproto"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2"
)

// Placeholder prefixes of request values that a request may carry more than
// once. Caddy joins repeated headers with commas and takes the first query
// value or cookie, while a backend may take another one: a key read from a
// repeated value would be a guess.
const (
	headerPrefix = "http.request.header."
	queryPrefix  = "http.request.uri.query."
	cookiePrefix = "http.request.cookie."
)

// template is a key or scope template of Caddy placeholders.
type template struct {
	raw    string
	inputs keyInputs
}

// keyInputs are the request values a template reads.
type keyInputs struct {
	headers   []string // canonical header names
	queries   []string
	cookies   []string
	jsonPaths []string // after jsonPrefix
	formNames []string // after formPrefix
}

func parseTemplate(s string) template {
	t := template{raw: s}
	// Caddy's own scanner finds the placeholders: an empty replacer knows
	// none, so the function sees every one of them.
	_, _ = caddy.NewEmptyReplacer().ReplaceFunc(s, func(key string, val any) (any, error) {
		in := &t.inputs
		switch {
		case strings.HasPrefix(key, headerPrefix):
			in.headers = appendNew(in.headers, textproto.CanonicalMIMEHeaderKey(key[len(headerPrefix):]))
		case strings.HasPrefix(key, queryPrefix):
			in.queries = appendNew(in.queries, key[len(queryPrefix):])
		case strings.HasPrefix(key, cookiePrefix):
			in.cookies = appendNew(in.cookies, key[len(cookiePrefix):])
		case strings.HasPrefix(key, jsonPrefix):
			in.jsonPaths = appendNew(in.jsonPaths, key[len(jsonPrefix):])
		case strings.HasPrefix(key, formPrefix):
			in.formNames = appendNew(in.formNames, key[len(formPrefix):])
		}
		return val, nil
	})
	return t
}

func appendNew(list []string, s string) []string {
	if slices.Contains(list, s) {
		return list
	}
	return append(list, s)
}

// merge is the union of two templates' inputs.
func (in keyInputs) merge(o keyInputs) keyInputs {
	for _, h := range o.headers {
		in.headers = appendNew(in.headers, h)
	}
	for _, q := range o.queries {
		in.queries = appendNew(in.queries, q)
	}
	for _, c := range o.cookies {
		in.cookies = appendNew(in.cookies, c)
	}
	for _, p := range o.jsonPaths {
		in.jsonPaths = appendNew(in.jsonPaths, p)
	}
	for _, n := range o.formNames {
		in.formNames = appendNew(in.formNames, n)
	}
	return in
}

// repeated reports whether r carries one of the header fields, query
// parameters or cookies read by the templates more than once.
func (in keyInputs) repeated(r *http.Request) bool {
	for _, h := range in.headers {
		if len(r.Header[h]) > 1 {
			return true
		}
	}
	if len(in.queries) > 0 {
		q := r.URL.Query()
		for _, name := range in.queries {
			if len(q[name]) > 1 {
				return true
			}
		}
	}
	if len(in.cookies) > 0 {
		cookies := r.Cookies()
		for _, name := range in.cookies {
			n := 0
			for _, c := range cookies {
				if strings.EqualFold(c.Name, name) {
					n++
				}
			}
			if n > 1 {
				return true
			}
		}
	}
	return false
}

// expand replaces the placeholders in t, each value passed through f when
// f is not nil. missing is true when any of them expanded to nothing
// (unknown placeholders included), so that
// "order:{http.redis_lock.json.order_id}" without an order id never becomes
// the shared lock "order:".
func (t template) expand(repl *caddy.Replacer, f func(key string, val any) (any, error)) (out string, missing bool, err error) {
	if t.raw == "" {
		return "", false, nil
	}
	out, err = repl.ReplaceFunc(t.raw, func(key string, val any) (any, error) {
		if f != nil {
			var err error
			if val, err = f(key, val); err != nil {
				return nil, err
			}
		}
		if caddy.ToString(val) == "" {
			missing = true
		}
		return val, nil
	})
	return out, missing, err
}
