package redislock

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"net/http"

	"github.com/gowebpki/jcs"
)

// fingerprint is the hex SHA-256 of the parts of r that must match for a
// replay, each named and length-prefixed, so that no two different requests
// share one. The path and query are compared as sent, the body byte for
// byte, or as JSON in its canonical form (canonical, from canonicalJSON).
//
// The small parts are appended to one buffer and hashed with one Write: a
// slice handed to the hash (an interface) escapes, so writing each name,
// length and value on its own cost an allocation apiece. The body is
// hashed where it is, not copied: it can be max_body long.
func (c *IdempotencyConfig) fingerprint(r *http.Request, body, canonical []byte) string {
	h := sha256.New()
	buf := make([]byte, 0, 256)
	for _, part := range c.Fingerprint {
		switch part {
		case partMethod:
			buf = appendPart(buf, part, r.Method)
		case partPath:
			buf = appendPart(buf, part, r.URL.EscapedPath())
		case partQuery:
			buf = appendPart(buf, part, r.URL.RawQuery)
		case partBody:
			buf = appendPrefix(buf, part, len(body))
			buf = flush(h, buf)
			h.Write(body)
		case partJSON:
			buf = appendPrefix(buf, part, len(canonical))
			buf = flush(h, buf)
			h.Write(canonical)
		}
	}
	for _, name := range c.FingerprintHeaders {
		values := r.Header.Values(name)
		n := max(len(values)-1, 0) // the "\x00"s between values
		for _, v := range values {
			n += len(v)
		}
		buf = appendPrefix(buf, "header "+http.CanonicalHeaderKey(name), n)
		for i, v := range values {
			if i > 0 {
				buf = append(buf, 0)
			}
			buf = append(buf, v...)
		}
	}
	flush(h, buf)
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0]))
}

// appendPart appends a part: its name and its value, each after its
// length as a uvarint.
func appendPart(b []byte, name, value string) []byte {
	return append(appendPrefix(b, name, len(value)), value...)
}

// appendPrefix appends a part's name with its length, and the length of the
// value that follows.
func appendPrefix(b []byte, name string, valueLen int) []byte {
	b = binary.AppendUvarint(b, uint64(len(name)))
	b = append(b, name...)
	return binary.AppendUvarint(b, uint64(valueLen))
}

// flush writes b to h and returns it emptied.
func flush(h hash.Hash, b []byte) []byte {
	h.Write(b)
	return b[:0]
}

// canonicalJSON is body in the RFC 8785 canonical form (members sorted,
// numbers as ECMAScript writes them, no insignificant whitespace), when the
// fingerprint compares the body as JSON: a client that re-serialises its
// body on a retry (members in another order, 1e3 for 1000) sends the same
// request. A body that is not JSON, or names a member twice, is
// errInvalidJSON; no body is no body.
func (c *IdempotencyConfig) canonicalJSON(body []byte) ([]byte, error) {
	if !c.fingerprints(partJSON) || len(body) == 0 {
		return nil, nil
	}
	canonical, err := jcs.Transform(body)
	if err != nil {
		return nil, errInvalidJSON
	}
	return canonical, nil
}
