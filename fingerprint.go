package redislock

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"net/http"
	"strings"
)

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
