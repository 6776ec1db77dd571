// Package redislock is a Caddy HTTP handler, redis_lock, that takes a Redis
// lock keyed from the request (an Idempotency-Key header, an order id in the
// JSON body, ...) before the next handler runs, so that duplicate requests
// arriving at any Caddy node are not processed twice: a duplicate that meets
// a held lock gets 409 Conflict. The lock is renewed while the request is in
// flight, its fencing token is sent upstream, and it is released before the
// response completes. The lock itself lives in the lock package.
package redislock

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"golang.org/x/net/http/httpguts"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
	"github.com/reqlock/caddy-redis-lock/internal/redisconn"
	"github.com/reqlock/caddy-redis-lock/record"
)

func init() {
	caddy.RegisterModule(new(Handler))
}

// Values of the enumerated options.
const (
	MissingKeyReject = "reject"
	MissingKeyPass   = "pass"

	OnErrorFailClosed = "fail_closed"
	OnErrorFailOpen   = "fail_open"

	LostLockAbort    = "abort"
	LostLockContinue = "continue"

	ErrorsRespond      = "respond"
	ErrorsHandleErrors = "handle_errors"
)

// Defaults of the options.
const (
	DefaultTTL           = 10 * time.Second
	DefaultPrefix        = engine.DefaultPrefix
	DefaultFencingHeader = "Fencing-Token"
	DefaultMaxBody       = 64 << 10
)

// Handler takes a Redis lock keyed from the request before calling the next
// handler, and answers 409 Conflict while another request holds it.
//
// Placeholders it sets for logs, headers and later handlers:
//
//   - {http.redis_lock.key}: the Redis key of the lock (hashed: never the raw
//     request data);
//   - {http.redis_lock.fencing_token}: the lock's fencing token;
//   - {http.redis_lock.record_key}: with idempotency, the Redis key of the
//     request's record (DEL it to let a retry of an outcome-unknown
//     request run);
//   - {http.redis_lock.result}: what happened to the request (the list
//     of results is in results.go and in docs/reference.md).
//
// The same values label the caddy_redis_lock_requests_total metric.
type Handler struct {
	// Name names the handler in the admin API (/redis_lock/), where it may
	// be left out of a query while the config has one handler. Unique in a
	// config: given twice, it must be to copies of one configuration (a
	// snippet imported into several sites). Default: none.
	Name string `json:"name,omitempty"`

	// Key is the template of the lock's name: Caddy placeholders such as
	// {http.request.header.Idempotency-Key}, plus
	// {http.redis_lock.json.<path>} for fields of a JSON request body
	// (dotted path, array indices as numbers: items.0.sku) and
	// {http.redis_lock.form.<field>} for fields of an
	// application/x-www-form-urlencoded body. The key
	// is missing when any placeholder in it expands to nothing; so is a
	// body field of a request without a body. With Idempotency's Key, this
	// key is an account's: it serialises, the record's key deduplicates.
	// Required.
	Key string `json:"key,omitempty"`

	// TTL is the lease of the lock. Default: 10s.
	TTL caddy.Duration `json:"ttl,omitempty"`

	// Renew is the keep-alive interval while the request is in flight.
	// Default: TTL/3.
	Renew caddy.Duration `json:"renew,omitempty"`

	// RenewOff turns the keep-alive off: the lease ends after TTL even
	// while the request is still in flight (Caddyfile: renew off).
	RenewOff bool `json:"renew_off,omitempty"`

	// Wait is how long to wait for a held lock before answering 409.
	// Default: 0 (do not wait).
	Wait caddy.Duration `json:"wait,omitempty"`

	// Prefix of the Redis keys: locks are <prefix>{<h4>}<h> (h the hex
	// SHA-256 of scope and key, h4 its first 4 digits), records
	// <lock>:result, and <prefix>{<h4>}fence holds the last fencing token
	// issued to the locks of that tag. Default: "redis_lock:".
	Prefix string `json:"prefix,omitempty"`

	// Scope is a template (same placeholders as Key) hashed into the key
	// together with it: a tenant, best an authenticated identity such as
	// {http.auth.user.id}, never a header a client can choose. Default:
	// empty.
	Scope string `json:"scope,omitempty"`

	// MissingKey is what happens when the key is missing: "reject" answers
	// 400, "pass" passes the request on unlocked. Default: "reject".
	MissingKey string `json:"missing_key,omitempty"`

	// OnError is what happens when Redis is unavailable: "fail_closed"
	// answers 503 with Retry-After: 1, "fail_open" logs a warning and passes
	// the request on unlocked. Default: "fail_closed".
	OnError string `json:"on_error,omitempty"`

	// LostLock is what happens when the lock is lost while the request is in
	// flight: "abort" cancels the upstream request and answers 502
	// outcome-unknown (503 lock-lost when the request never left; a
	// response already started is aborted), "continue" only logs and counts.
	// Default: "abort".
	LostLock string `json:"lost_lock,omitempty"`

	// FencingHeader is the request header that carries the fencing token
	// upstream; a value sent by the client is always removed. Default:
	// "Fencing-Token".
	FencingHeader string `json:"fencing_header,omitempty"`

	// FencingHeaderOff turns the fencing header off (Caddyfile:
	// fencing_header off).
	FencingHeaderOff bool `json:"fencing_header_off,omitempty"`

	// MaxBody is how many bytes of the request body are read when the key,
	// the scope or the record's key uses {http.redis_lock.json.*} or
	// {http.redis_lock.form.*}, or the idempotency fingerprint includes the
	// body (body or json); a larger body gets 413.
	// Default: 65536 (64KiB).
	MaxBody int64 `json:"max_body,omitempty"`

	// Errors is how error responses are produced: "respond" writes an RFC
	// 9457 application/problem+json body, "handle_errors" returns the error
	// (with the same status and headers) to the site's handle_errors
	// routes. Default: "respond".
	Errors string `json:"errors,omitempty"`

	// Redis is the connection to Redis. Default: standalone at
	// 127.0.0.1:6379.
	Redis *RedisConfig `json:"redis,omitempty"`

	// Idempotency, when present (even empty), stores every finished
	// response under its key and replays it to later requests with the same
	// key, instead of running them again. Default: off (the lock only).
	Idempotency *IdempotencyConfig `json:"idempotency,omitempty"`

	locker      *engine.Client
	store       *record.Store // idempotency records; nil without idempotency
	readsBody   bool          // the key, the scope or the fingerprint reads the body
	conn        *redisconn.Conn
	poolKey     string
	logger      *zap.Logger
	keyTmpl     template
	scopeTmpl   template
	recordTmpl  template         // idempotency's own key (per-account serialisation)
	inputs      keyInputs        // what the key, the scope and the record's key read from a request
	unavailable *rateLimitedWarn // Redis unavailable: 503 or fail_open
	releaseWarn *rateLimitedWarn // a release or a give-up that failed
	storeWarn   *rateLimitedWarn // an answer that could not be stored
	unackedWarn *rateLimitedWarn // an answer the replicas did not acknowledge
	abandonWarn *rateLimitedWarn // a record its holder left unfinished
	events      *events
	holds       *holdTimes    // for Retry-After
	redisMode   string        // resolved: for the admin API's list
	answersHeld *atomic.Int64 // bytes of the answers stored in the background (storeInBackground)
}

// CaddyModule returns the Caddy module information. A pointer receiver: the
// events app asks an event's origin for it in the goroutine that emits the
// event, and a value receiver would copy the handler there while Cleanup
// writes it.
func (*Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.redis_lock",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision applies defaults and gets a Redis connection from the shared pool.
// It never contacts Redis, so `caddy validate` works while Redis is down.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	// A rate limiter per kind of warning: one kind's flood must not
	// silence another.
	h.unavailable, h.releaseWarn = new(rateLimitedWarn), new(rateLimitedWarn)
	h.storeWarn, h.unackedWarn = new(rateLimitedWarn), new(rateLimitedWarn)
	h.abandonWarn = new(rateLimitedWarn)
	h.answersHeld = new(atomic.Int64)
	ev, err := newEvents(ctx)
	if err != nil {
		return fmt.Errorf("redis_lock: the events app: %w", err)
	}
	h.events = ev
	h.holds = new(holdTimes)
	h.applyDefaults()
	h.keyTmpl = parseTemplate(h.Key)
	h.scopeTmpl = parseTemplate(h.Scope)
	h.inputs = h.keyTmpl.inputs.merge(h.scopeTmpl.inputs)
	if h.Idempotency != nil && h.Idempotency.Key != "" {
		h.recordTmpl = parseTemplate(h.Idempotency.Key)
		h.inputs = h.inputs.merge(h.recordTmpl.inputs)
	}
	h.readsBody = len(h.inputs.jsonPaths) > 0 || len(h.inputs.formNames) > 0 || h.Idempotency.fingerprints(partBody) || h.Idempotency.fingerprints(partJSON)
	if err := registerMetrics(ctx.GetMetricsRegistry()); err != nil {
		return fmt.Errorf("redis_lock: %w", err)
	}

	if h.Idempotency != nil {
		var err error
		if h.Idempotency.policy, err = parseStorePolicy(h.Idempotency.Store); err != nil {
			return fmt.Errorf("redis_lock: %w", err)
		}
	}
	rc, err := h.Redis.resolve()
	if err != nil {
		return fmt.Errorf("redis_lock: %w", err)
	}
	conn, key, err := acquireConn(rc)
	if err != nil {
		return fmt.Errorf("redis_lock: %w", err)
	}
	h.conn, h.poolKey = conn, key
	h.redisMode = rc.Mode
	h.locker = engine.NewWithBackend(conn.Backend(), &engine.Config{
		OnRenew: observeRenew,
		// One attempt and at most one retry, pool wait and dial included;
		// a release holds the end of a response for at most one.
		CallTimeout:    2 * time.Duration(rc.Timeout),
		ReleaseTimeout: time.Duration(rc.Timeout),
		MaxBackground:  maxBackground,
	})
	if h.Idempotency != nil {
		if h.store, err = record.NewStore(h.locker); err != nil {
			return fmt.Errorf("redis_lock: %w", err)
		}
	}
	if err := register(ctx, h); err != nil {
		return fmt.Errorf("redis_lock: %w", err)
	}
	h.logger.Debug("redis_lock provisioned",
		zap.Object("redis", rc), zap.Duration("ttl", time.Duration(h.TTL)))
	return nil
}

// applyDefaults fills in every option left unset.
func (h *Handler) applyDefaults() {
	if h.TTL == 0 {
		h.TTL = caddy.Duration(DefaultTTL)
	}
	if h.Prefix == "" {
		h.Prefix = DefaultPrefix
	}
	if h.MissingKey == "" {
		h.MissingKey = MissingKeyReject
	}
	if h.OnError == "" {
		h.OnError = OnErrorFailClosed
	}
	if h.LostLock == "" {
		h.LostLock = LostLockAbort
	}
	if h.FencingHeader == "" && !h.FencingHeaderOff {
		h.FencingHeader = DefaultFencingHeader
	}
	if h.MaxBody == 0 {
		h.MaxBody = DefaultMaxBody
	}
	if h.Errors == "" {
		h.Errors = ErrorsRespond
	}
	if h.Redis == nil {
		h.Redis = new(RedisConfig)
	}
	h.Idempotency.applyDefaults()
}

// Validate checks the configuration.
func (h *Handler) Validate() error {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(h.Key != "", "key is required")
	check(h.TTL > 0, "ttl must be positive, got %v", time.Duration(h.TTL))
	check(h.Renew >= 0, "renew must not be negative, got %v", time.Duration(h.Renew))
	check(h.Renew == 0 || h.Renew < h.TTL, "renew (%v) must be shorter than ttl (%v)", time.Duration(h.Renew), time.Duration(h.TTL))
	check(h.Renew == 0 || !h.RenewOff, "renew and renew_off are mutually exclusive")
	check(h.Wait >= 0, "wait must not be negative, got %v", time.Duration(h.Wait))
	check(h.MaxBody > 0, "max_body must be positive, got %d", h.MaxBody)
	check(h.MissingKey == MissingKeyReject || h.MissingKey == MissingKeyPass,
		"missing_key must be %s or %s, got %q", MissingKeyReject, MissingKeyPass, h.MissingKey)
	check(h.OnError == OnErrorFailClosed || h.OnError == OnErrorFailOpen,
		"on_error must be %s or %s, got %q", OnErrorFailClosed, OnErrorFailOpen, h.OnError)
	check(h.LostLock == LostLockAbort || h.LostLock == LostLockContinue,
		"lost_lock must be %s or %s, got %q", LostLockAbort, LostLockContinue, h.LostLock)
	check(h.Errors == ErrorsRespond || h.Errors == ErrorsHandleErrors,
		"errors must be %s or %s, got %q", ErrorsRespond, ErrorsHandleErrors, h.Errors)
	check(h.FencingHeaderOff || httpguts.ValidHeaderFieldName(h.FencingHeader), "fencing_header %q is not a valid header name", h.FencingHeader)
	if h.Idempotency != nil {
		errs = append(errs, h.Idempotency.validate())
		check(!h.Idempotency.ReplayCookies || h.Scope != "",
			"idempotency: replay_cookies needs a scope, such as scope {http.request.cookie.session}: without one, a cookie stored for one client would be replayed to any client that sends the same key")
	}
	if h.Redis != nil {
		if err := h.Redis.validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("redis_lock: %w", err)
	}
	return nil
}

// Cleanup gives the Redis connection back to the shared pool; the last
// user retires it.
func (h *Handler) Cleanup() error {
	unregister(h)
	if h.poolKey == "" {
		return nil
	}
	key := h.poolKey
	h.poolKey = ""
	return releaseConn(key)
}

// Interface guards.
var (
	_ caddy.Module                = (*Handler)(nil)
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
