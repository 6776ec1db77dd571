package redislock

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
)

// jsonPrefix starts the placeholders that read fields of a JSON request body.
const jsonPrefix = "http.redis_lock.json."

// Errors of reading a JSON body for the key.
var (
	errBodyTooLarge = errors.New("request body too large")
	errInvalidJSON  = errors.New("request body is not JSON")
	// errAmbiguousJSON: the body names a key field more than once, or in
	// another letter case. A backend may read another value than the lock
	// did (encoding/json matches names case-insensitively and keeps the
	// last), so such a body is refused rather than locked on a guess.
	errAmbiguousJSON = errors.New("key field of the JSON body is ambiguous")
)

// readBody reads at most max bytes of r's body and puts them back for the
// next handler, which can also re-read them (GetBody) for retries. A body
// of length 0 is not read: Caddy wraps even an absent body, and reading it
// cost a bodyless idempotent request (a GET or DELETE) a 512-byte buffer.
func readBody(r *http.Request, max int64) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return nil, nil
	}
	buf, err := io.ReadAll(io.LimitReader(r.Body, max+1))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, errBodyTooLarge
		}
		return nil, err
	}
	if int64(len(buf)) > max {
		return nil, errBodyTooLarge
	}
	r.Body = io.NopCloser(bytes.NewReader(buf))
	r.ContentLength = int64(len(buf))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf)), nil }
	return buf, nil
}

// jsonFields resolves the {http.redis_lock.json.*} placeholders of body:
// the paths the key and scope read (paths) fail when ambiguous; any other
// path, such as one in a log format, reads as "" when ambiguous.
func jsonFields(body *jsonValue, paths []string) (caddy.ReplacerFunc, error) {
	vals := make(map[string]string, len(paths))
	for _, p := range paths {
		v, err := jsonField(body, p)
		if err != nil {
			return nil, err
		}
		vals[p] = v
	}
	return func(key string) (any, bool) {
		path, ok := strings.CutPrefix(key, jsonPrefix)
		if !ok {
			return nil, false
		}
		if v, ok := vals[path]; ok {
			return v, true
		}
		v, _ := jsonField(body, path)
		return v, true
	}, nil
}

// jsonValue is a parsed JSON value that keeps what a Go map drops: every
// member of an object, duplicates included, so that a key field named twice
// can be told from one named once.
type jsonValue struct {
	kind    jsonKind
	text    string       // a string's value, a number's literal, true/false
	members []jsonMember // object
	elems   []*jsonValue // array
}

type jsonKind uint8

const (
	jsonNull jsonKind = iota
	jsonString
	jsonNumber
	jsonBool
	jsonObject
	jsonArray
)

type jsonMember struct {
	name  string
	value *jsonValue
}

// parseJSON parses buf as exactly one JSON value.
func parseJSON(buf []byte) (*jsonValue, error) {
	if len(buf) == 0 {
		return nil, errInvalidJSON
	}
	dec := json.NewDecoder(bytes.NewReader(buf))
	dec.UseNumber() // numbers keep their literal text
	v, err := decodeValue(dec)
	if err != nil {
		return nil, errInvalidJSON
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errInvalidJSON // trailing data
	}
	return v, nil
}

func decodeValue(dec *json.Decoder) (*jsonValue, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case nil:
		return &jsonValue{kind: jsonNull}, nil
	case string:
		return &jsonValue{kind: jsonString, text: t}, nil
	case json.Number:
		return &jsonValue{kind: jsonNumber, text: string(t)}, nil
	case bool:
		return &jsonValue{kind: jsonBool, text: strconv.FormatBool(t)}, nil
	case json.Delim:
		switch t {
		case '{':
			v := &jsonValue{kind: jsonObject}
			for dec.More() {
				nt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				name, ok := nt.(string)
				if !ok {
					return nil, errInvalidJSON
				}
				mv, err := decodeValue(dec)
				if err != nil {
					return nil, err
				}
				v.members = append(v.members, jsonMember{name, mv})
			}
			_, err := dec.Token() // '}'
			return v, err
		case '[':
			v := &jsonValue{kind: jsonArray}
			for dec.More() {
				ev, err := decodeValue(dec)
				if err != nil {
					return nil, err
				}
				v.elems = append(v.elems, ev)
			}
			_, err := dec.Token() // ']'
			return v, err
		}
	}
	return nil, errInvalidJSON
}

// jsonField returns the text of the value at a dotted path (array elements
// by index): strings as they are, numbers by value, booleans as true/false,
// objects and arrays as canonical compact JSON; "" when it is absent or
// null. It fails with errAmbiguousJSON when an object on the path has the
// name more than once or only in another letter case.
func jsonField(v *jsonValue, path string) (string, error) {
	for seg := range strings.SplitSeq(path, ".") {
		switch v.kind {
		case jsonObject:
			var found *jsonValue
			for _, m := range v.members {
				if !strings.EqualFold(m.name, seg) {
					continue
				}
				if found != nil || m.name != seg {
					return "", errAmbiguousJSON
				}
				found = m.value
			}
			if found == nil {
				return "", nil
			}
			v = found
		case jsonArray:
			i, ok := arrayIndex(seg)
			if !ok || i >= len(v.elems) {
				return "", nil
			}
			v = v.elems[i]
		default:
			return "", nil
		}
	}
	switch v.kind {
	case jsonNull:
		return "", nil
	case jsonString, jsonBool:
		return v.text, nil
	case jsonNumber:
		return canonicalNumber(v.text), nil
	}
	var b strings.Builder
	if err := v.writeCanonical(&b); err != nil {
		return "", err
	}
	return b.String(), nil
}

// arrayIndex parses a path segment of decimal digits.
func arrayIndex(seg string) (int, bool) {
	if seg == "" || len(seg) > 9 {
		return 0, false
	}
	for i := 0; i < len(seg); i++ {
		if seg[i] < '0' || seg[i] > '9' {
			return 0, false
		}
	}
	n, _ := strconv.Atoi(seg)
	return n, true
}

// canonicalNumber is a number's text by value as an IEEE-754 double, the
// widest reading a backend may give it: 1000, 1e3 and 1000.0 are "1000".
// Two integers beyond 2^53 that round to the same double share a key, which
// can only make requests wait for each other, never let a duplicate by.
func canonicalNumber(lit string) string {
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return lit // not reached: the decoder checked the syntax
	}
	if f == 0 || math.IsNaN(f) {
		return "0" // also -0
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

// writeCanonical writes v as compact JSON with object members sorted by
// name and numbers by value. Names that repeat (in any letter case) are
// ambiguous.
func (v *jsonValue) writeCanonical(b *strings.Builder) error {
	switch v.kind {
	case jsonNull:
		b.WriteString("null")
	case jsonBool:
		b.WriteString(v.text)
	case jsonNumber:
		b.WriteString(canonicalNumber(v.text))
	case jsonString:
		writeJSONString(b, v.text)
	case jsonArray:
		b.WriteByte('[')
		for i, e := range v.elems {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := e.writeCanonical(b); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case jsonObject:
		ms := slices.Clone(v.members)
		slices.SortFunc(ms, func(a, b jsonMember) int { return strings.Compare(a.name, b.name) })
		seen := make(map[string]bool, len(ms))
		b.WriteByte('{')
		for i, m := range ms {
			if f := foldName(m.name); seen[f] {
				return errAmbiguousJSON
			} else {
				seen[f] = true
			}
			if i > 0 {
				b.WriteByte(',')
			}
			writeJSONString(b, m.name)
			b.WriteByte(':')
			if err := m.value.writeCanonical(b); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	default:
		return fmt.Errorf("unknown JSON kind %d", v.kind)
	}
	return nil
}

// foldName maps names that strings.EqualFold takes as equal to one string
// (the round trip through upper case folds the Kelvin sign and the long s).
func foldName(s string) string { return strings.ToLower(strings.ToUpper(s)) }

// writeJSONString writes s as a JSON string without HTML escaping.
func writeJSONString(b *strings.Builder, s string) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	b.Write(bytes.TrimSuffix(buf.Bytes(), []byte("\n")))
}
