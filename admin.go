package redislock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
	"github.com/reqlock/caddy-redis-lock/record"
)

func init() {
	caddy.RegisterModule(adminAPI{})
}

// adminAPI serves /redis_lock/ on Caddy's admin endpoint, under its access
// controls: the configured handlers, and the lock and record of one key,
// which an operator may clear (an outcome-unknown record, say) so that the
// next retry runs.
type adminAPI struct{}

// CaddyModule returns the Caddy module information.
func (adminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.redis_lock",
		New: func() caddy.Module { return new(adminAPI) },
	}
}

// Routes returns the admin API's routes.
func (a adminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{
		{Pattern: "/redis_lock/", Handler: caddy.AdminHandlerFunc(a.serveList)},
		{Pattern: "/redis_lock/keys", Handler: caddy.AdminHandlerFunc(a.serveKey)},
	}
}

// handlerInfo is a handler in the list: no secrets.
type handlerInfo struct {
	Name        string `json:"name"`
	Prefix      string `json:"prefix"`
	Mode        string `json:"mode"`
	Idempotency bool   `json:"idempotency"`
}

// serveList answers GET /redis_lock/ with the active config's handlers.
func (adminAPI) serveList(w http.ResponseWriter, r *http.Request) error {
	if r.URL.Path != "/redis_lock/" {
		return apiError(http.StatusNotFound, "not found: %s", r.URL.Path)
	}
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		return apiError(http.StatusMethodNotAllowed, "method not allowed: %s", r.Method)
	}
	list := []handlerInfo{}
	for _, h := range activeHandlers() {
		list = append(list, handlerInfo{Name: h.Name, Prefix: h.Prefix, Mode: h.redisMode, Idempotency: h.Idempotency != nil})
	}
	// By name: the order handlers are provisioned in is the servers'
	// map order, not the config's.
	slices.SortStableFunc(list, func(a, b handlerInfo) int { return strings.Compare(a.Name, b.Name) })
	return writeJSON(w, http.StatusOK, list)
}

// keyState is the answer of GET /redis_lock/keys.
type keyState struct {
	Name      string `json:"name"`
	Key       string `json:"key"`
	RedisKey  string `json:"redis_key"`
	RecordKey string `json:"record_key,omitempty"`
	// IdempotencyKey and AccountLock: a record of a per-account handler
	// (`idempotency { key }`), looked up by both keys; Lock is then the
	// record's own lock, AccountLock the account's.
	IdempotencyKey string       `json:"idempotency_key,omitempty"`
	AccountLock    *lockState   `json:"account_lock,omitempty"`
	Lock           lockState    `json:"lock"`
	Record         *recordState `json:"record,omitempty"`
	// Nodes are the Redlock masters' own answers.
	Nodes []nodeState `json:"nodes,omitempty"`
}

type lockState struct {
	Held         bool  `json:"held"`
	FencingToken int64 `json:"fencing_token,omitempty"`
	TTLMs        int64 `json:"ttl_ms,omitempty"`
}

type recordState struct {
	State       string `json:"state"`
	Status      int    `json:"status,omitempty"`
	BodyBytes   *int   `json:"body_bytes,omitempty"`
	ExpiresInMs int64  `json:"expires_in_ms,omitempty"`
}

type nodeState struct {
	Name   string       `json:"name"`
	Error  string       `json:"error,omitempty"`
	Lock   *lockState   `json:"lock,omitempty"`
	Record *recordState `json:"record,omitempty"`
}

// The states of a record.
const (
	stateNone           = "none"
	stateInProgress     = "in_progress"
	stateCompleted      = "completed"
	stateOutcomeUnknown = "outcome_unknown"
	stateNotReplayable  = "not_replayable"
	stateAbandoned      = "abandoned"  // in progress, its holder's lease gone: retries get outcome-unknown
	stateUnreadable     = "unreadable" // not a record this version can read
)

// serveKey answers GET (look up) and DELETE (clear the record) on
// /redis_lock/keys?key=<key>&scope=<scope>&name=<name>, and
// &idempotency_key=<key> for a per-account handler's records.
func (adminAPI) serveKey(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet && r.Method != http.MethodDelete {
		w.Header().Set("Allow", "GET, DELETE")
		return apiError(http.StatusMethodNotAllowed, "method not allowed: %s", r.Method)
	}
	q := r.URL.Query()
	for _, p := range []string{"key", "scope", "name", "idempotency_key"} {
		if len(q[p]) > 1 {
			return apiError(http.StatusBadRequest, "%s is given more than once", p)
		}
	}
	if q.Get("key") == "" {
		return apiError(http.StatusBadRequest, "key is required: the expanded key template, such as the Idempotency-Key header's value")
	}
	h, unhold, err := holdHandler(func(all []*Handler) (*Handler, error) { return findHandler(all, q.Get("name")) })
	if err != nil {
		return err
	}
	defer unhold()
	// A scope left out (or given to a handler without one) names a key
	// that no request can have: say so rather than answer "none".
	if h.Scope != "" && q.Get("scope") == "" {
		return apiError(http.StatusBadRequest, "this handler has a scope (%s): give scope=, its expanded value", h.Scope)
	}
	if h.Scope == "" && q.Has("scope") {
		return apiError(http.StatusBadRequest, "this handler has no scope: leave scope= out")
	}
	k, err := h.adminKey(q.Get("key"), q.Get("scope"), q)
	if err != nil {
		return err
	}
	store, err := h.inspector()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.locker.Config().CallTimeout)
	defer cancel()
	if r.Method == http.MethodDelete {
		if k.record == "" && h.Idempotency != nil {
			return apiError(http.StatusBadRequest, "this handler keys its records by its idempotency key (%s): give idempotency_key=", h.Idempotency.Key)
		}
		return h.removeRecord(ctx, w, store, k.lookup())
	}
	in, nodes, err := store.Inspect(ctx, k.lookup())
	if err != nil {
		return redisError(err)
	}
	out := keyState{Name: h.Name, Key: k.key, RedisKey: k.lookup(), RecordKey: k.recordKey(), Lock: lockOf(in)}
	if k.record != "" {
		out.Record = recordOf(in)
	}
	if k.record != "" && k.record != k.lock {
		out.IdempotencyKey = k.idempotencyKey
		acct, _, err := store.Inspect(ctx, k.lock)
		if err != nil {
			return redisError(err)
		}
		l := lockOf(acct)
		out.AccountLock = &l
	}
	for _, n := range nodes {
		ns := nodeState{Name: n.Name}
		if n.Err != nil {
			ns.Error = n.Err.Error()
		} else {
			l := lockOf(n.Inspection)
			ns.Lock = &l
			if h.Idempotency != nil {
				ns.Record = recordOf(n.Inspection)
			}
		}
		out.Nodes = append(out.Nodes, ns)
	}
	return writeJSON(w, http.StatusOK, out)
}

// adminLookup is a key an operator gives: the lock's key, and its
// record's (the lock's own with idempotency, or within it by the
// idempotency key with `idempotency { key }`; "" without a record).
type adminLookup struct {
	requestKey
	key, idempotencyKey string
}

// lookup is the key looked up: the record's lock, or the lock alone.
func (k adminLookup) lookup() string {
	if k.record != "" {
		return k.record
	}
	return k.lock
}

// adminKey reads the key (and idempotency_key) an operator gives as the
// handler reads a request's: a header's value as an sf-string's inside.
func (h *Handler) adminKey(key, scope string, q url.Values) (adminLookup, error) {
	perAccount := h.Idempotency != nil && h.Idempotency.Key != ""
	if q.Has("idempotency_key") && !perAccount {
		return adminLookup{}, apiError(http.StatusBadRequest, "this handler has no idempotency { key }: leave idempotency_key= out")
	}
	var err error
	if h.Idempotency != nil && !perAccount {
		if key, err = normaliseKey(h.keyTmpl, key); err != nil {
			return adminLookup{}, apiError(http.StatusBadRequest, "%v", err)
		}
	}
	k := adminLookup{key: key}
	k.lock = engine.Key(h.Prefix, scope, key)
	switch {
	case h.Idempotency == nil:
	case !perAccount:
		k.record = k.lock
	case q.Get("idempotency_key") != "":
		if k.idempotencyKey, err = normaliseKey(h.recordTmpl, q.Get("idempotency_key")); err != nil {
			return adminLookup{}, apiError(http.StatusBadRequest, "%v", err)
		}
		k.record = engine.Key(h.Prefix, k.lock, k.idempotencyKey)
	}
	return k, nil
}

// removeRecord answers DELETE: the record removed (200), none (404), or
// the key in progress (409, nothing removed).
func (h *Handler) removeRecord(ctx context.Context, w http.ResponseWriter, store *record.Store, rkey string) error {
	outcome, err := store.Remove(ctx, rkey)
	replicated := !errors.Is(err, engine.ErrNotReplicated)
	if !replicated {
		err = nil
	}
	switch {
	case errors.Is(err, record.ErrHeld):
		return apiError(http.StatusConflict, "%v", err)
	case errors.Is(err, record.ErrNoRecord) && h.Idempotency == nil:
		return apiError(http.StatusNotFound, "the key's lock is free, and this handler keeps no records")
	case errors.Is(err, record.ErrNoRecord):
		return apiError(http.StatusNotFound, "the key has no record")
	case err != nil:
		return redisError(err)
	}
	h.logger.Info("idempotency record removed through the admin API",
		zap.String("record_key", record.Key(rkey)), zap.String("state", stateOf(outcome)))
	out := map[string]any{"removed": record.Key(rkey), "state": stateOf(outcome)}
	if !replicated {
		// Removed on the primary; a failover may bring it back.
		out["replicated"] = false
	}
	return writeJSON(w, http.StatusOK, out)
}

// inspector is the record store that looks keys up: the handler's own, or,
// for a lock without idempotency, one on its client (its locks only).
func (h *Handler) inspector() (*record.Store, error) {
	if h.store != nil {
		return h.store, nil
	}
	s, err := record.NewStore(h.locker)
	if err != nil {
		return nil, apiError(http.StatusInternalServerError, "%v", err)
	}
	return s, nil
}

// findHandler is the active config's handler called name; with name "",
// its only handler.
func findHandler(all []*Handler, name string) (*Handler, error) {
	if name != "" {
		for _, h := range all {
			if h.Name == name {
				return h, nil
			}
		}
		return nil, apiError(http.StatusNotFound, "no redis_lock handler is named %q", name)
	}
	switch len(all) {
	case 0:
		return nil, apiError(http.StatusNotFound, "no redis_lock handler is configured")
	case 1:
		return all[0], nil
	}
	var names []string
	for _, h := range all {
		if h.Name != "" {
			names = append(names, fmt.Sprintf("%q", h.Name))
		}
	}
	if len(names) == 0 {
		return nil, apiError(http.StatusBadRequest, "%d redis_lock handlers are configured and none has a name: name them (the name subdirective) and choose one with name=", len(all))
	}
	return nil, apiError(http.StatusBadRequest, "%d redis_lock handlers are configured: choose one with name= (named: %s; an unnamed one cannot be chosen)", len(all), strings.Join(names, ", "))
}

func lockOf(in record.Inspection) lockState {
	if !in.Held {
		return lockState{}
	}
	return lockState{Held: true, FencingToken: in.Fence, TTLMs: ms(in.LockTTL)}
}

func recordOf(in record.Inspection) *recordState {
	switch {
	case in.Unreadable:
		return &recordState{State: stateUnreadable, ExpiresInMs: ms(in.RecordTTL)}
	case in.Record != nil:
		n := len(in.Record.Body)
		return &recordState{State: stateOf(in.Record.Outcome), Status: in.Record.Status, BodyBytes: &n, ExpiresInMs: ms(in.RecordTTL)}
	case in.InProgress:
		return &recordState{State: stateInProgress, ExpiresInMs: ms(in.RecordTTL)}
	case in.Abandoned:
		return &recordState{State: stateAbandoned, ExpiresInMs: ms(in.RecordTTL)}
	}
	return &recordState{State: stateNone}
}

func stateOf(o record.Outcome) string {
	switch o {
	case 0:
		return stateUnreadable
	case record.Unknown:
		return stateOutcomeUnknown
	case record.NotReplayable:
		return stateNotReplayable
	case record.Abandoned:
		return stateAbandoned
	}
	return stateCompleted
}

// ms is d in milliseconds, at least 1; 0 (the field left out) for a key
// with no expiry.
func ms(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return max(1, d.Milliseconds())
}

// redisError is the answer to a lookup or removal that failed: 503 when
// Redis did not answer, else 500 (a record this version cannot read).
func redisError(err error) error {
	if errors.Is(err, engine.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) {
		return apiError(http.StatusServiceUnavailable, "redis: %v", err)
	}
	return apiError(http.StatusInternalServerError, "%v", err)
}

func apiError(status int, format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	return caddy.APIError{HTTPStatus: status, Err: err, Message: err.Error()}
}

func writeJSON(w http.ResponseWriter, status int, v any) error {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	return json.NewEncoder(w).Encode(v)
}

// Interface guards.
var _ caddy.AdminRouter = adminAPI{}
