package redislock

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// problemTypeBase starts the stable type URIs of the problem bodies.
const problemTypeBase = "https://github.com/reqlock/caddy-redis-lock#"

// problem is an RFC 9457 problem the handler answers with.
type problem struct {
	slug       string // the type URI's fragment
	status     int
	title      string
	detail     string
	retryAfter int // seconds; 0: no Retry-After
}

// The handler's problems. Details never name Redis internals or the key.
var (
	problemConflict = problem{slug: "conflict", status: http.StatusConflict, title: "Request in progress",
		detail: "Another request with the same key is being processed; retry later."}
	problemMissingKey = problem{slug: "missing-key", status: http.StatusBadRequest, title: "Missing request key",
		detail: "The request does not carry the value this endpoint is keyed by."}
	problemInvalidJSON = problem{slug: "invalid-json", status: http.StatusBadRequest, title: "Invalid JSON body",
		detail: "The request body must be a JSON document."}
	problemAmbiguousKey = problem{slug: "ambiguous-key", status: http.StatusBadRequest, title: "Ambiguous request key",
		detail: "The value this endpoint is keyed by appears more than once in the request, or in another letter case."}
	problemBodyTimeout = problem{slug: "body-timeout", status: http.StatusRequestTimeout, title: "Request body timeout",
		detail: "The request body did not arrive in time."}
	problemBodyUnreadable = problem{slug: "body-unreadable", status: http.StatusBadRequest, title: "Unreadable request body",
		detail: "The request body could not be read."}
	problemBodyTooLarge = problem{slug: "body-too-large", status: http.StatusRequestEntityTooLarge, title: "Request body too large",
		detail: "The request body is larger than this endpoint reads to find its key."}
	problemUnavailable = problem{slug: "unavailable", status: http.StatusServiceUnavailable, title: "Service unavailable",
		detail: "The request could not be coordinated right now; retry later.", retryAfter: 1}
	problemLockLost = problem{slug: "lock-lost", status: http.StatusServiceUnavailable, title: "Lock lost",
		detail: "The request could not be completed safely and was cancelled; retry later.", retryAfter: 1}
	problemInvalidIdempotencyKey = problem{slug: "invalid-idempotency-key", status: http.StatusBadRequest, title: "Invalid idempotency key",
		detail: "The idempotency key must be 1 to 255 printable ASCII characters, bare or as a quoted string."}
	problemInProgress = problem{slug: "in-progress", status: http.StatusConflict, title: "Request in progress",
		detail: "A request with the same idempotency key is being processed; retry later to get its result."}
	problemMismatch = problem{slug: "key-reused", status: http.StatusUnprocessableEntity, title: "Idempotency key reused",
		detail: "This idempotency key was used for a different request; use a new key for a new request."}
	problemNotReplayable = problem{slug: "not-replayable", status: http.StatusUnprocessableEntity, title: "Result not replayable",
		detail: "A request with this idempotency key was processed, but its response was not kept (too large, streamed, or HEAD); it is not run again."}
	problemOutcomeUnknown = problem{slug: "outcome-unknown", status: http.StatusBadGateway, title: "Outcome unknown",
		detail: "The request reached the backend but its answer was lost, so it may have taken effect; check before retrying with a new key."}
	problemTooEarly = problem{slug: "too-early", status: http.StatusTooEarly, title: "Too early",
		detail: "This request may not be sent as TLS early data; retry after the handshake."}
)

// withRetryAfter returns p with a Retry-After of secs seconds, at least 1.
func (p problem) withRetryAfter(secs int) problem {
	p.retryAfter = max(secs, 1)
	return p
}

// problemJSON is the wire form of a problem.
type problemJSON struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
}

// body is p's problem+json body and the headers that go with it.
func (p problem) body() ([]byte, http.Header) {
	// Marshalling four plain fields cannot fail.
	b, _ := json.Marshal(problemJSON{Type: problemTypeBase + p.slug, Title: p.title, Status: p.status, Detail: p.detail})
	hdr := http.Header{
		"Content-Type":           {"application/problem+json"},
		"Cache-Control":          {"no-store"},
		"X-Content-Type-Options": {"nosniff"},
	}
	if p.retryAfter > 0 {
		hdr.Set("Retry-After", strconv.Itoa(p.retryAfter))
	}
	return b, hdr
}

// writeProblem answers with p: a problem+json body in respond mode, or
// caddyhttp.Error for the site's handle_errors routes, with the same status
// and headers either way.
func (h *Handler) writeProblem(w http.ResponseWriter, p problem) error {
	body, phdr := p.body()
	hdr := w.Header()
	hdr.Set("Cache-Control", "no-store")
	if v := phdr.Get("Retry-After"); v != "" {
		hdr.Set("Retry-After", v)
	}
	if h.Errors == ErrorsHandleErrors {
		return caddyhttp.Error(p.status, errors.New("redis_lock: "+p.slug+": "+p.title))
	}
	hdr.Set("Content-Type", "application/problem+json")
	hdr.Set("Content-Length", strconv.Itoa(len(body)))
	hdr.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(p.status)
	_, _ = w.Write(body)
	return nil
}
