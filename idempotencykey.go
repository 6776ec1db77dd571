package redislock

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2"
)

// errInvalidIdempotencyKey: a header value used as an idempotency key that
// is neither a bare token nor an RFC 8941 sf-string of 1 to 255 printable
// ASCII characters.
var errInvalidIdempotencyKey = errors.New("invalid idempotency key")

// maxIdempotencyKey is the longest key value accepted.
const maxIdempotencyKey = 255

// idempotencyKeyValue parses a header value used as an idempotency key. The
// IETF draft makes Idempotency-Key an sf-string ("abc"); most SDKs send a
// bare value (abc). Both are accepted and are one key: the value inside the
// quotes is what is hashed.
func idempotencyKeyValue(v string) (string, error) {
	if !strings.HasPrefix(v, `"`) {
		if len(v) > maxIdempotencyKey || !printableASCII(v) {
			return "", errInvalidIdempotencyKey
		}
		return v, nil
	}
	// An sf-string: DQUOTE *( unescaped / "\" ( DQUOTE / "\" ) ) DQUOTE.
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i == len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", errInvalidIdempotencyKey
			}
			b.WriteByte(v[i])
		case c == '"':
			if i != len(v)-1 || b.Len() == 0 || b.Len() > maxIdempotencyKey {
				return "", errInvalidIdempotencyKey
			}
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", errInvalidIdempotencyKey
		default:
			b.WriteByte(c)
		}
	}
	return "", errInvalidIdempotencyKey // no closing quote
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// idempotencyKeyPlaceholder reads a header in an idempotency key as an
// Idempotency-Key value (a bare token or an sf-string, see
// idempotencyKeyValue); other placeholders pass as they are.
func idempotencyKeyPlaceholder(key string, val any) (any, error) {
	if !strings.HasPrefix(key, headerPrefix) {
		return val, nil
	}
	return idempotencyKeyValue(caddy.ToString(val))
}

// normaliseKey is the key an operator gives for a template's expansion
// (the admin API), as the handler of an idempotency key hashes it: the
// value of each header in it read as an Idempotency-Key, so that the
// header's sf-string form ("abc") names the same key as its bare form.
// Every way of splitting key along the template's literal parts is tried:
// a key whose readings differ, or that none reads, is an error (give it
// unquoted, as the handler hashes it). A key with no quote is as given.
func normaliseKey(t template, key string) (string, error) {
	if !strings.Contains(key, `"`) {
		return key, nil // no sf-string: every value reads as itself
	}
	var isHeader []bool
	skeleton, _ := caddy.NewEmptyReplacer().ReplaceFunc(t.raw, func(ph string, _ any) (any, error) {
		isHeader = append(isHeader, strings.HasPrefix(ph, headerPrefix))
		return "\x00", nil
	})
	lits := strings.Split(skeleton, "\x00")
	if !slices.Contains(isHeader, true) || len(lits) != len(isHeader)+1 {
		return key, nil // no header in it (or a template Caddy cannot read)
	}
	readings := map[string]bool{}
	budget := maxKeySplits
	var walk func(i int, rest string, b string)
	walk = func(i int, rest, b string) {
		if budget--; budget < 0 || len(readings) > 1 {
			return
		}
		if i == len(isHeader) {
			if rest == lits[i] {
				readings[b+rest] = true
			}
			return
		}
		if !strings.HasPrefix(rest, lits[i]) {
			return
		}
		b, rest = b+lits[i], rest[len(lits[i]):]
		for end := 1; end <= len(rest); end++ { // values are never empty
			v := rest[:end]
			if isHeader[i] {
				var err error
				if v, err = idempotencyKeyValue(v); err != nil {
					continue
				}
			}
			walk(i+1, rest[end:], b+v)
		}
	}
	walk(0, key, "")
	switch {
	case budget < 0 || len(readings) > 1:
		return "", fmt.Errorf("the key reads more than one way against the template %s: give it as the handler hashes it, each header's value unquoted", t.raw)
	case len(readings) == 0:
		return "", fmt.Errorf("the key does not read against the template %s: each header's value must be a token or an sf-string of 1 to %d printable ASCII characters", t.raw, maxIdempotencyKey)
	}
	for k := range readings {
		return k, nil
	}
	return key, nil
}

// maxKeySplits bounds the splits normaliseKey tries.
const maxKeySplits = 100_000
