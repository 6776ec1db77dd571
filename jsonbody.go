package redislock

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
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
)

// readJSONBody reads at most max bytes of r's body, parses it as one JSON
// value and puts the bytes back for the next handler.
func readJSONBody(r *http.Request, max int64) (any, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, errInvalidJSON
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

	dec := json.NewDecoder(bytes.NewReader(buf))
	dec.UseNumber() // numbers keep their literal text
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, errInvalidJSON
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errInvalidJSON // trailing data
	}
	return v, nil
}

// jsonProvider makes {http.redis_lock.json.<path>} placeholders of body.
func jsonProvider(body any) caddy.ReplacerFunc {
	return func(key string) (any, bool) {
		path, ok := strings.CutPrefix(key, jsonPrefix)
		if !ok {
			return nil, false
		}
		return jsonField(body, path), true
	}
}

// jsonField returns the text of the value at a dotted path (array elements
// by index): strings as they are, numbers as written, booleans as
// true/false, objects and arrays as compact JSON. Absent and null are "".
func jsonField(v any, path string) string {
	for _, seg := range strings.Split(path, ".") {
		switch x := v.(type) {
		case map[string]any:
			v = x[seg]
		case []any:
			i, err := strconv.Atoi(seg)
			if err != nil || i < 0 || i >= len(x) {
				return ""
			}
			v = x[i]
		default:
			return ""
		}
	}
	switch x := v.(type) {
	case nil:
		return ""
	case string:
		return x
	case json.Number:
		return x.String()
	case bool:
		return strconv.FormatBool(x)
	default:
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(x); err != nil {
			return ""
		}
		return strings.TrimSuffix(b.String(), "\n")
	}
}
