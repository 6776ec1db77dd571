package redislock

import (
	"errors"
	"mime"
	"net/http"
	"net/url"
	"strings"

	"github.com/caddyserver/caddy/v2"
)

// formPrefix starts the placeholders that read fields of an
// application/x-www-form-urlencoded request body.
const formPrefix = "http.redis_lock.form."

// Errors of reading a form body for the key.
var (
	errNotForm = errors.New("request body is not application/x-www-form-urlencoded")
	// errAmbiguousForm: the body sends a key field twice, or another field
	// that a common backend framework reads as the key field (PHP turns
	// '.' and ' ' in a name into '_'; PHP and Rails read "f[]" as f).
	errAmbiguousForm = errors.New("key field of the form body is ambiguous")
)

// parseForm parses body as form data: r must say so in its Content-Type,
// and the body must be valid URL encoding (no bad escape, no ';').
func parseForm(r *http.Request, body []byte) (url.Values, error) {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "application/x-www-form-urlencoded" {
		return nil, errNotForm
	}
	vals, err := url.ParseQuery(string(body))
	if err != nil {
		return nil, errNotForm
	}
	return vals, nil
}

// formFields resolves the {http.redis_lock.form.*} placeholders of vals:
// the names the key and scope read (names, taken exactly, case and
// brackets included) fail when ambiguous; any other name reads as "" then.
// A field that is absent reads as "", which the template takes as missing.
func formFields(vals url.Values, names []string) (caddy.ReplacerFunc, error) {
	for _, n := range names {
		if _, err := formField(vals, n); err != nil {
			return nil, err
		}
	}
	return func(key string) (any, bool) {
		name, ok := strings.CutPrefix(key, formPrefix)
		if !ok {
			return nil, false
		}
		v, _ := formField(vals, name)
		return v, true
	}, nil
}

// formField is the value of the field name, or errAmbiguousForm when it is
// sent twice or another field folds onto it (phpName).
func formField(vals url.Values, name string) (string, error) {
	vs := vals[name]
	if len(vs) > 1 {
		return "", errAmbiguousForm
	}
	folded := phpName(name)
	for other := range vals {
		if other != name && phpName(other) == folded {
			return "", errAmbiguousForm
		}
	}
	if len(vs) == 0 {
		return "", nil
	}
	return vs[0], nil
}

// phpName is the name a backend framework reads a field as: before the
// first '[', PHP turns '.' and ' ' into '_'; a trailing "[]" (a list) is
// dropped, as PHP and Rails read "f[]" as f.
func phpName(name string) string {
	head, rest := name, ""
	if i := strings.IndexByte(name, '['); i >= 0 {
		head, rest = name[:i], name[i:]
	}
	head = strings.NewReplacer(".", "_", " ", "_").Replace(head)
	rest = strings.TrimSuffix(rest, "[]")
	return head + rest
}
