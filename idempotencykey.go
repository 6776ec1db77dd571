package redislock

import (
	"errors"
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
// header's sf-string form ("abc") names the same key as its bare form. A
// key that does not follow the template's literal parts, or whose header
// values cannot be told apart, is left as it is.
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
	if !slices.Contains(isHeader, true) || !strings.HasPrefix(key, lits[0]) {
		return key, nil
	}
	var b strings.Builder
	b.WriteString(lits[0])
	rest := key[len(lits[0]):]
	for i, header := range isHeader {
		next := lits[i+1]
		var val string
		switch {
		case i == len(isHeader)-1:
			if !strings.HasSuffix(rest, next) {
				return key, nil
			}
			val, rest = rest[:len(rest)-len(next)], next
		case next == "":
			return key, nil // two placeholders side by side
		default:
			j := strings.Index(rest, next)
			if j < 0 {
				return key, nil
			}
			val, rest = rest[:j], rest[j:]
		}
		if header {
			v, err := idempotencyKeyValue(val)
			if err != nil {
				return "", err
			}
			val = v
		}
		b.WriteString(val)
		b.WriteString(next)
		rest = rest[len(next):]
	}
	return b.String(), nil
}
