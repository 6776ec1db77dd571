package redislock

import (
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/encode"
	"github.com/klauspost/compress/zstd"
	"go.uber.org/zap"

	"github.com/reqlock/caddy-redis-lock/record"
)

// replayedHeader marks an answer that comes from the record, not from the
// backend (as Stripe's API does).
const replayedHeader = "Idempotent-Replayed"

// replay answers with a stored response: its status, headers and body,
// correct for this request's Accept-Encoding. An answer whose body was not
// kept is a problem that says so.
func (h *Handler) replay(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, resp *record.Response) error {
	h.count(repl, resultReplayed)
	hdr := w.Header()
	hdr.Set(replayedHeader, "true")
	if resp.Outcome == record.NotReplayable {
		return h.writeProblem(w, problemNotReplayable)
	}
	maps.Copy(hdr, resp.Header) // decoded for this request alone
	body := resp.Body
	if enc := strings.ToLower(hdr.Get("Content-Encoding")); enc != "" && enc != "identity" && !acceptsEncoding(r, enc) {
		decoded, err := decodeBody(enc, body, decodeLimit(h.Idempotency.MaxResponse))
		if err != nil {
			return caddyhttp.Error(http.StatusInternalServerError, fmt.Errorf("replaying a %s response: %w", enc, err))
		}
		body = decoded
		hdr.Del("Content-Encoding")
	}
	if bodyAllowed(resp.Status) {
		hdr.Set("Content-Length", strconv.Itoa(len(body)))
	}
	w.WriteHeader(resp.Status)
	if bodyAllowed(resp.Status) && r.Method != http.MethodHead {
		_, _ = w.Write(body) // a failed write means the client is gone
	}
	return nil
}

// abandoned answers a request whose record its holder left unfinished
// (record.ErrAbandoned): its node died, or was cut off from Redis past its
// lease, while the request may have been at the backend. The answer is a
// stored outcome-unknown's, as every retry gets until the holder's own
// answer lands or an operator removes the record: a retry must not charge
// again unseen.
func (h *Handler) abandoned(w http.ResponseWriter, repl *caddy.Replacer, k requestKey) error {
	h.count(repl, resultAbandoned)
	h.events.emit(eventOutcomeUnknown, k.record, k.recordKey(), 0, resultAbandoned)
	h.abandonWarn.warn(h.logger, "a retry of a request whose holder left it unfinished: answered 502 outcome-unknown; check the backend, then DELETE the record through the admin API (/redis_lock/keys) to let a retry run",
		zap.String("record_key", k.recordKey()))
	w.Header().Set(replayedHeader, "true")
	return writeProblemBody(w, problemOutcomeUnknown)
}

// bodyAllowed: 1xx, 204 and 304 responses have no body.
func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}

// acceptsEncoding reports whether r accepts a response body in enc.
func acceptsEncoding(r *http.Request, enc string) bool {
	accepted := encode.AcceptedEncodings(r, nil)
	return slices.Contains(accepted, enc) || slices.Contains(accepted, "*") ||
		(enc == "gzip" && slices.Contains(accepted, "x-gzip"))
}

// decodableEncodings are the content codings a stored body can be decoded
// from, for a replay to a client that does not accept them.
var decodableEncodings = []string{"gzip", "x-gzip", "deflate", "zstd", "identity"}

// restrictAcceptEncoding keeps only the codings in decodableEncodings in r's
// Accept-Encoding, so that whatever the backend (or an encode handler after
// this one) compresses with, a replay can decode for another client.
func restrictAcceptEncoding(r *http.Request) {
	vals := r.Header.Values("Accept-Encoding")
	if len(vals) == 0 {
		return
	}
	var kept []string
	for _, v := range vals {
		for item := range strings.SplitSeq(v, ",") {
			item = strings.TrimSpace(item)
			name, _, _ := strings.Cut(item, ";")
			if slices.Contains(decodableEncodings, strings.ToLower(strings.TrimSpace(name))) {
				kept = append(kept, item)
			}
		}
	}
	if len(kept) == 0 {
		r.Header.Del("Accept-Encoding")
		return
	}
	r.Header.Set("Accept-Encoding", strings.Join(kept, ", "))
}

// decodeLimit bounds a decoded body: a stored body is at most max bytes,
// and a coding that expands it past this is not a response to replay.
func decodeLimit(max int64) int64 { return max * 64 }

// decodeBody decodes a body stored in content coding enc.
func decodeBody(enc string, body []byte, limit int64) ([]byte, error) {
	var rd io.Reader
	switch enc {
	case "gzip", "x-gzip":
		zr, err := gzip.NewReader(bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		rd = zr
	case "deflate":
		zr, err := zlib.NewReader(bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		rd = zr
	case "zstd":
		zr, err := zstd.NewReader(bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		defer zr.Close()
		rd = zr
	default:
		return nil, fmt.Errorf("unsupported content coding %q", enc)
	}
	out, err := io.ReadAll(io.LimitReader(rd, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(out)) > limit {
		return nil, fmt.Errorf("decoded body larger than %d bytes", limit)
	}
	return out, nil
}
