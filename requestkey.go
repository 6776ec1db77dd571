package redislock

import (
	"errors"
	"net/http"
	"os"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
	"github.com/reqlock/caddy-redis-lock/record"
)

// requestKey is what a request is locked by: its lock key and, with
// idempotency, its record's lock key and its fingerprint. The record's key
// is the lock's own, or with `idempotency { key }` its own key within the
// scope and the lock's key; "" when the request runs under the lock alone.
// It is missing when the key or the scope expands to nothing.
type requestKey struct {
	lock        string
	record      string
	fingerprint string
	missing     bool
}

// recordKey is the Redis key of k's record; "" without one.
func (k requestKey) recordKey() string {
	if k.record == "" {
		return ""
	}
	return record.Key(k.record)
}

// refusal is a request refused before any lock: the result it counts and
// the problem it is answered.
type refusal struct {
	result string
	p      problem
}

func (e *refusal) Error() string { return "redis_lock: request refused: " + e.p.slug }

// templateError is a key or scope template that failed to expand: a 500.
type templateError struct{ err error }

func (e templateError) Error() string { return e.err.Error() }
func (e templateError) Unwrap() error { return e.err }

// keyOf derives r's key, reading its inputs in order: the fencing header
// stripped (only this handler may set it), early data and repeated inputs
// refused, the body's JSON and form fields, the scope and key templates
// with the Idempotency-Key, and the fingerprint. An error is a *refusal, a
// body that could not be read (refuse maps both), or a 500.
func (h *Handler) keyOf(r *http.Request, repl *caddy.Replacer) (requestKey, error) {
	if !h.FencingHeaderOff {
		stripFencing(r, h.FencingHeader)
	}
	// Early data can be replayed by an attacker: never take a lock on it.
	if r.TLS != nil && !r.TLS.HandshakeComplete {
		return requestKey{}, &refusal{resultTooEarly, problemTooEarly}
	}
	if h.inputs.repeated(r) {
		return requestKey{}, &refusal{resultRejected, problemAmbiguousKey}
	}
	body, err := h.bodyFields(r, repl)
	if err != nil {
		return requestKey{}, err
	}
	scope, scopeMissing, err := h.scopeTmpl.expand(repl, nil)
	if err != nil {
		return requestKey{}, templateError{err}
	}
	var keyValue func(key string, val any) (any, error)
	if h.Idempotency != nil && h.Idempotency.Key == "" {
		keyValue = idempotencyKeyPlaceholder
	}
	key, keyMissing, err := h.keyTmpl.expand(repl, keyValue)
	if errors.Is(err, errInvalidIdempotencyKey) {
		return requestKey{}, &refusal{resultRejected, problemInvalidIdempotencyKey}
	} else if err != nil {
		return requestKey{}, templateError{err}
	}
	if keyMissing || scopeMissing {
		return requestKey{missing: true}, nil
	}
	k := requestKey{lock: engine.Key(h.Prefix, scope, key)}
	repl.Set(phKey, k.lock)
	if k.record, err = h.recordOf(repl, k.lock); err != nil {
		return requestKey{}, err
	}
	if k.record != "" {
		canonical, err := h.Idempotency.canonicalJSON(body)
		if err != nil {
			return requestKey{}, err
		}
		k.fingerprint = h.Idempotency.fingerprint(r, body, canonical)
	}
	return k, nil
}

// recordOf is the lock key of a request's record: the lock's own key with
// idempotency, or its own key (recordTmpl) within the lock's key with
// `idempotency { key }`, where the lock's key is already within the scope:
// two accounts that pick the same idempotency key never meet. Without its
// own key, the request runs under the lock alone (missing_key pass), or is
// missing.
func (h *Handler) recordOf(repl *caddy.Replacer, lockKey string) (string, error) {
	switch {
	case h.Idempotency == nil:
		return "", nil
	case h.Idempotency.Key == "":
		return lockKey, nil
	}
	key, missing, err := h.recordTmpl.expand(repl, idempotencyKeyPlaceholder)
	switch {
	case errors.Is(err, errInvalidIdempotencyKey):
		return "", &refusal{resultRejected, problemInvalidIdempotencyKey}
	case err != nil:
		return "", templateError{err}
	case missing && h.MissingKey == MissingKeyPass:
		return "", nil
	case missing:
		return "", &refusal{resultRejected, problemMissingKey}
	}
	return engine.Key(h.Prefix, lockKey, key), nil
}

// bodyFields reads r's body when the key, the scope or the fingerprint
// needs it, and maps its JSON and form fields to their placeholders. A
// request without a body (the GET of a checkout page on the path its form
// posts to) has no fields: its key is missing, not invalid.
func (h *Handler) bodyFields(r *http.Request, repl *caddy.Replacer) ([]byte, error) {
	if !h.readsBody {
		return nil, nil
	}
	body, err := readBody(r, h.MaxBody)
	if err != nil || len(body) == 0 {
		return body, err
	}
	if len(h.inputs.jsonPaths) > 0 {
		doc, err := parseJSON(body)
		if err != nil {
			return nil, err
		}
		fields, err := jsonFields(doc, h.inputs.jsonPaths)
		if err != nil {
			return nil, &refusal{resultRejected, problemAmbiguousKey}
		}
		repl.Map(fields)
	}
	if len(h.inputs.formNames) > 0 {
		vals, err := parseForm(r, body)
		if err != nil {
			return nil, &refusal{resultRejected, problemInvalidForm}
		}
		fields, err := formFields(vals, h.inputs.formNames)
		if err != nil {
			return nil, &refusal{resultRejected, problemAmbiguousKey}
		}
		repl.Map(fields)
	}
	return body, nil
}

// refuse answers a request whose key could not be derived (keyOf's error):
// never with the 200 of an empty response.
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, err error) error {
	var rf *refusal
	var te templateError
	switch {
	case errors.As(err, &rf):
		return h.reject(w, repl, rf.result, rf.p)
	case errors.As(err, &te):
		return caddyhttp.Error(http.StatusInternalServerError, te.err)
	case errors.Is(err, errBodyTooLarge):
		return h.reject(w, repl, resultRejected, problemBodyTooLarge)
	case errors.Is(err, errInvalidJSON):
		return h.reject(w, repl, resultRejected, problemInvalidJSON)
	case errors.Is(err, os.ErrDeadlineExceeded):
		// The server's read timeout: the client may still be there.
		return h.reject(w, repl, resultRejected, problemBodyTimeout)
	case r.Context().Err() != nil:
		// The client went away: nobody to answer. 499 is what
		// reverse_proxy logs in this case too.
		h.count(repl, resultCancelled)
		return caddyhttp.Error(499, err)
	default:
		return h.reject(w, repl, resultRejected, problemBodyUnreadable)
	}
}
