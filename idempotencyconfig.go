package redislock

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"golang.org/x/net/http/httpguts"
)

// Defaults of the idempotency block.
const (
	DefaultRetention   = 24 * time.Hour
	DefaultMaxResponse = 1 << 20
)

// Fingerprint parts.
const (
	partMethod = "method"
	partPath   = "path"
	partQuery  = "query"
	partBody   = "body"
	partJSON   = "json" // the body compared as JSON, by value
)

// fingerprintParts are the default fingerprint.
var fingerprintParts = []string{partMethod, partPath, partQuery, partBody}

// knownParts are the parts there are.
var knownParts = []string{partMethod, partPath, partQuery, partBody, partJSON}

// IdempotencyConfig configures storing finished responses and replaying
// them to later requests with the same key.
type IdempotencyConfig struct {
	// Key is the record's own key, a template (say
	// {http.request.header.Idempotency-Key}): it deduplicates, while the
	// handler's key (say an account) serialises. At most one request per
	// handler key runs at a time, whatever its idempotency key; the record
	// is keyed by this key within the scope and the handler's key, and a
	// retry of a finished request is replayed without taking the handler's
	// lock. Default: the handler's key is the record's too.
	Key string `json:"key,omitempty"`
	// Retention is how long a finished response is kept. Default: 24h.
	Retention caddy.Duration `json:"retention,omitempty"`
	// Fingerprint lists the request parts that must match the stored
	// request's for a replay (else 422): method, path, query, and body
	// (byte for byte) or json (by value: the RFC 8785 canonical form, so a
	// client that re-serialises its body is the same request; a body that
	// is not JSON is 400). Default: method, path, query, body, unless
	// FingerprintHeaders is set alone.
	Fingerprint []string `json:"fingerprint,omitempty"`
	// FingerprintHeaders lists request headers that are part of the
	// fingerprint (Caddyfile: fingerprint header <name>).
	FingerprintHeaders []string `json:"fingerprint_headers,omitempty"`
	// MaxResponse is the largest response body stored; a larger one is
	// completed without its body and cannot be replayed. Default: 1MiB.
	MaxResponse int64 `json:"max_response,omitempty"`
	// Store lists the answers stored for retries: classes ("2xx") and
	// statuses ("409"). A class leaves out 408, 425, 429 and 503; a status
	// named is stored. An answer not stored frees the key, so that its
	// retry runs; outcome-unknown is always stored. Default: every answer
	// but 408, 425, 429 and 503.
	Store []string `json:"store,omitempty"`
	// ReplayCookies stores the backend's Set-Cookie with the answer and
	// replays it, so that Post/Redirect/Get with a cookie session shows
	// the receipt after a double click whose first answer the browser
	// dropped. It needs the handler's Scope: a replayed cookie must only
	// ever reach the client the scope names.
	ReplayCookies bool `json:"replay_cookies,omitempty"`

	policy *storePolicy // Store, parsed at provision time; nil: the default
}

// applyDefaults fills in what is unset; nil stays nil (idempotency off).
func (c *IdempotencyConfig) applyDefaults() {
	if c == nil {
		return
	}
	if c.Retention == 0 {
		c.Retention = caddy.Duration(DefaultRetention)
	}
	if len(c.Fingerprint) == 0 && len(c.FingerprintHeaders) == 0 {
		c.Fingerprint = slices.Clone(fingerprintParts)
	}
	if c.MaxResponse == 0 {
		c.MaxResponse = DefaultMaxResponse
	}
}

func (c *IdempotencyConfig) validate() error {
	var errs []error
	if c.Retention <= 0 {
		errs = append(errs, fmt.Errorf("idempotency: retention must be positive, got %v", time.Duration(c.Retention)))
	}
	if c.Key != "" && strings.TrimSpace(c.Key) == "" {
		errs = append(errs, errors.New("idempotency: key is blank"))
	}
	if c.MaxResponse <= 0 {
		errs = append(errs, fmt.Errorf("idempotency: max_response must be positive, got %d", c.MaxResponse))
	}
	for _, p := range c.Fingerprint {
		if !slices.Contains(knownParts, p) {
			errs = append(errs, fmt.Errorf("idempotency: unknown fingerprint part %q (want method, path, query, body or json)", p))
		}
	}
	if slices.Contains(c.Fingerprint, partBody) && slices.Contains(c.Fingerprint, partJSON) {
		errs = append(errs, errors.New("idempotency: fingerprint body and json both compare the body: name one"))
	}
	if _, err := parseStorePolicy(c.Store); err != nil {
		errs = append(errs, err)
	}
	for _, name := range c.FingerprintHeaders {
		if !httpguts.ValidHeaderFieldName(name) {
			errs = append(errs, fmt.Errorf("idempotency: fingerprint header %q is not a valid header name", name))
		}
	}
	return errors.Join(errs...)
}

// fingerprints reports whether the fingerprint includes part; false with
// idempotency off.
func (c *IdempotencyConfig) fingerprints(part string) bool {
	return c != nil && slices.Contains(c.Fingerprint, part)
}
