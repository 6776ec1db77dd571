package redislock

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// problemTypeBase starts the stable type URIs of the problem bodies: each
// is a heading of the reference's "Problem types" (docs_test checks it).
const problemTypeBase = "https://github.com/reqlock/caddy-redis-lock/blob/main/docs/reference.md#"

// The error types of Stripe's API, for the body's error member: what
// Stripe's SDKs read to raise an error and to pick its class.
const (
	stripeIdempotencyError    = "idempotency_error"     // a key used wrongly, or in use
	stripeInvalidRequestError = "invalid_request_error" // the request itself is at fault
	stripeAPIError            = "api_error"             // the plugin could not do its part
)

// shouldRetryHeader is the header by which Stripe's API tells its SDKs
// whether to retry (stripe-node obeys it; stripe-go raises every answer
// whose body has an error member without retrying, whatever it says).
const shouldRetryHeader = "Stripe-Should-Retry"

// problem is an RFC 9457 problem the handler answers with.
type problem struct {
	slug       string // the type URI's fragment, and the error member's code
	status     int
	title      string
	json       []byte // the problem+json body, marshalled once
	retryAfter int    // seconds; 0: no Retry-After
	noRetry    bool   // Stripe-Should-Retry: false
}

// newProblem is the problem of slug, with its body: the RFC 9457 members and
// an error member in the shape of Stripe's API errors, of type errType.
func newProblem(slug string, status int, errType, title, detail string) problem {
	// Marshalling plain string and int fields cannot fail.
	b, _ := json.Marshal(problemJSON{
		Type: problemTypeBase + slug, Title: title, Status: status, Detail: detail,
		Error: stripeErrorJSON{Type: errType, Code: slug, Message: detail},
	})
	return problem{slug: slug, status: status, title: title, json: b}
}

// The handler's problems. Details never name Redis internals or the key.
var (
	problemConflict = newProblem("conflict", http.StatusConflict, stripeIdempotencyError, "Request in progress",
		"Another request with the same key is being processed; retry later.")
	problemMissingKey = newProblem("missing-key", http.StatusBadRequest, stripeInvalidRequestError, "Missing request key",
		"The request does not carry the value this endpoint is keyed by.")
	problemInvalidJSON = newProblem("invalid-json", http.StatusBadRequest, stripeInvalidRequestError, "Invalid JSON body",
		"The request body must be a JSON document.")
	problemInvalidForm = newProblem("invalid-form", http.StatusBadRequest, stripeInvalidRequestError, "Invalid form body",
		"The request body must be application/x-www-form-urlencoded form data.")
	problemAmbiguousKey = newProblem("ambiguous-key", http.StatusBadRequest, stripeInvalidRequestError, "Ambiguous request key",
		"The value this endpoint is keyed by appears more than once in the request, or in another letter case.")
	problemBodyTimeout = newProblem("body-timeout", http.StatusRequestTimeout, stripeInvalidRequestError, "Request body timeout",
		"The request body did not arrive in time.")
	problemBodyUnreadable = newProblem("body-unreadable", http.StatusBadRequest, stripeInvalidRequestError, "Unreadable request body",
		"The request body could not be read.")
	problemBodyTooLarge = newProblem("body-too-large", http.StatusRequestEntityTooLarge, stripeInvalidRequestError, "Request body too large",
		"The request body is larger than this endpoint reads to find its key.")
	problemUnavailable = newProblem("unavailable", http.StatusServiceUnavailable, stripeAPIError, "Service unavailable",
		"The request could not be coordinated right now; retry later.").withRetryAfter(1)
	problemLockLost = newProblem("lock-lost", http.StatusServiceUnavailable, stripeAPIError, "Lock lost",
		"The request could not be completed safely and was cancelled; retry later.").withRetryAfter(1)
	problemInvalidIdempotencyKey = newProblem("invalid-idempotency-key", http.StatusBadRequest, stripeInvalidRequestError, "Invalid idempotency key",
		"The idempotency key must be 1 to 255 printable ASCII characters, bare or as a quoted string.")
	problemInProgress = newProblem("in-progress", http.StatusConflict, stripeIdempotencyError, "Request in progress",
		"A request with the same idempotency key is being processed; retry later to get its result.")
	problemMismatch = newProblem("key-reused", http.StatusUnprocessableEntity, stripeIdempotencyError, "Idempotency key reused",
		"This idempotency key was used for a different request; use a new key for a new request.")
	problemNotReplayable = newProblem("not-replayable", http.StatusUnprocessableEntity, stripeIdempotencyError, "Result not replayable",
		"A request with this idempotency key was processed, but its response was not kept (too large, streamed, or HEAD); it is not run again.")
	problemOutcomeUnknown = newProblem("outcome-unknown", http.StatusBadGateway, stripeAPIError, "Outcome unknown",
		"The request reached the backend but its answer was lost, so it may have taken effect; check before retrying with a new key.").withoutRetry()
	problemTooEarly = newProblem("too-early", http.StatusTooEarly, stripeInvalidRequestError, "Too early",
		"This request may not be sent as TLS early data; retry after the handshake.")
)

// withRetryAfter returns p with a Retry-After of secs seconds, at least 1.
func (p problem) withRetryAfter(secs int) problem {
	p.retryAfter = max(secs, 1)
	return p
}

// withoutRetry returns p with Stripe-Should-Retry: false, for an answer that
// a retry with the same key only gets again.
func (p problem) withoutRetry() problem {
	p.noRetry = true
	return p
}

// problemJSON is the wire form of a problem: RFC 9457's members, and Stripe's
// error member as an extension (RFC 9457 section 3.2).
type problemJSON struct {
	Type   string          `json:"type"`
	Title  string          `json:"title"`
	Status int             `json:"status"`
	Detail string          `json:"detail"`
	Error  stripeErrorJSON `json:"error"`
}

// stripeErrorJSON is the error member, as Stripe's API errors have it:
// without it stripe-node takes any JSON body for a success, whatever the
// status, and stripe-go raises an untyped error.
type stripeErrorJSON struct {
	Type    string `json:"type"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

// headers are the headers that go with p's body.
func (p problem) headers() http.Header {
	hdr := http.Header{
		"Content-Type":           {"application/problem+json"},
		"Cache-Control":          {"no-store"},
		"X-Content-Type-Options": {"nosniff"},
	}
	if p.retryAfter > 0 {
		hdr.Set("Retry-After", strconv.Itoa(p.retryAfter))
	}
	if p.noRetry {
		hdr.Set(shouldRetryHeader, "false")
	}
	return hdr
}

// writeProblem answers with p: a problem+json body in respond mode, or
// caddyhttp.Error for the site's handle_errors routes, with the same status
// and caching and retry headers either way.
func (h *Handler) writeProblem(w http.ResponseWriter, p problem) error {
	if h.Errors == ErrorsHandleErrors {
		hdr := w.Header()
		hdr.Set("Cache-Control", "no-store")
		if p.retryAfter > 0 {
			hdr.Set("Retry-After", strconv.Itoa(p.retryAfter))
		}
		if p.noRetry {
			hdr.Set(shouldRetryHeader, "false")
		}
		return caddyhttp.Error(p.status, errors.New("redis_lock: "+p.slug+": "+p.title))
	}
	return writeProblemBody(w, p)
}

// writeProblemBody writes p's status, headers and problem+json body.
func writeProblemBody(w http.ResponseWriter, p problem) error {
	hdr := w.Header()
	for k, v := range p.headers() {
		hdr[k] = v
	}
	hdr.Set("Content-Length", strconv.Itoa(len(p.json)))
	w.WriteHeader(p.status)
	_, _ = w.Write(p.json)
	return nil
}
