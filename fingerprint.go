package redislock

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"hash"
	"net/http"
	"strings"
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

// fingerprint is the hex SHA-256 of the parts of r that must match for a
// replay, each named and length-prefixed, so that no two different requests
// share one. The path and query are compared as sent, the body byte for
// byte.
func (c *IdempotencyConfig) fingerprint(r *http.Request, body []byte) string {
	h := sha256.New()
	for _, part := range c.Fingerprint {
		switch part {
		case partMethod:
			writePart(h, part, []byte(r.Method))
		case partPath:
			writePart(h, part, []byte(r.URL.EscapedPath()))
		case partQuery:
			writePart(h, part, []byte(r.URL.RawQuery))
		case partBody:
			writePart(h, part, body) // not copied: it can be max_body long
		}
	}
	for _, name := range c.FingerprintHeaders {
		writePart(h, "header "+http.CanonicalHeaderKey(name), []byte(strings.Join(r.Header.Values(name), "\x00")))
	}
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0]))
}

func writePart(h hash.Hash, name string, value []byte) {
	var n [binary.MaxVarintLen64]byte
	h.Write(binary.AppendUvarint(n[:0], uint64(len(name))))
	h.Write([]byte(name))
	h.Write(binary.AppendUvarint(n[:0], uint64(len(value))))
	h.Write(value)
}
