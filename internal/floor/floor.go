// Package floor is the load test's floor: a Caddy handler that takes a Redis
// lock in the fewest steps any lock in front of reverse_proxy needs, and
// nothing more. SET key token NX PX (one round trip) before next, a
// compare-and-delete script (one more) after next and before the response
// goes out, through go-redis's deferred autopipeliner with the options
// redis_lock uses, or, as redis_lock sends them, on the client itself when
// no other command is in flight. No fencing token, no renewal, no lock context, no
// bounds on a hung Redis, no give-back, no metrics: what redis_lock costs
// beyond this site's cost is its own.
//
// The load test's Caddy (tools/loadcaddy) registers it with Register; the
// plugin never does.
package floor

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/redis/go-redis/v9"
)

// Register adds the floor to Caddy's modules and its Caddyfile directive,
// redis_lock_floor: once, before Caddy loads a config.
func Register() {
	caddy.RegisterModule(new(Handler))
	httpcaddyfile.RegisterHandlerDirective("redis_lock_floor", parseCaddyfile)
}

// Handler is the floor: `redis_lock_floor <host:port>` in a route, keyed
// by the request's Idempotency-Key header.
type Handler struct {
	Address string `json:"address,omitempty"`

	rdb    *redis.Client
	ap     *redis.AutoPipeliner
	prefix string // per process, so that tokens are unique
	seq    atomic.Uint64
	busy   atomic.Int64 // commands in flight
}

// CaddyModule returns the Caddy module information.
func (*Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.redis_lock_floor", New: func() caddy.Module { return new(Handler) }}
}

// lease is the lock's TTL, redis_lock's default.
const lease = 10 * time.Second

// release deletes the lock if it is still the caller's.
var release = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

// Provision connects as redis_lock does: the same timeouts and retries, the
// same deferred autopipeliner.
func (h *Handler) Provision(caddy.Context) error {
	h.rdb = redis.NewClient(&redis.Options{
		Addr:                  h.Address,
		ContextTimeoutEnabled: true,
		ReadTimeout:           time.Second,
		WriteTimeout:          time.Second,
		MaxRetries:            1,
		DialerRetries:         1,
	})
	opt := redis.DefaultBlockingAutoPipelineOptions()
	opt.MaxQueuedCommands = 10000
	ap, err := h.rdb.AsyncAutoPipelineWithOptions(opt)
	if err != nil {
		return err
	}
	h.ap = ap
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return err
	}
	h.prefix = hex.EncodeToString(b[:]) + "-"
	return nil
}

// Cleanup closes the clients.
func (h *Handler) Cleanup() error {
	if h.ap != nil {
		_ = h.ap.Close()
	}
	if h.rdb != nil {
		return h.rdb.Close()
	}
	return nil
}

// bodies holds next's answers until the lock is released.
var bodies = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// ServeHTTP locks, calls next with its answer held back, releases, answers.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	key := r.Header.Get("Idempotency-Key")
	if key == "" {
		return caddyhttp.Error(http.StatusBadRequest, fmt.Errorf("no Idempotency-Key"))
	}
	key = "redis_lock_floor:" + key
	token := h.prefix + strconv.FormatUint(h.seq.Add(1), 10)
	ctx := r.Context()
	set := redis.NewStatusCmd(ctx, "set", key, token, "nx", "px", lease.Milliseconds())
	if err := h.send(ctx, set); err == redis.Nil {
		return caddyhttp.Error(http.StatusConflict, fmt.Errorf("held"))
	} else if err != nil {
		return caddyhttp.Error(http.StatusServiceUnavailable, err)
	}
	buf := bodies.Get().(*bytes.Buffer)
	buf.Reset()
	defer bodies.Put(buf)
	rec := caddyhttp.NewResponseRecorder(w, buf, func(int, http.Header) bool { return true })
	nextErr := next.ServeHTTP(rec, r)
	// Released whether or not the client is still there: a lock that a
	// client's going away leaves for its lease is no lock to measure.
	rctx := context.WithoutCancel(ctx)
	del := redis.NewCmd(rctx, "evalsha", release.Hash(), 1, key, token)
	if err := h.send(rctx, del); err != nil {
		if !redis.HasErrorPrefix(err, "NOSCRIPT") {
			return caddyhttp.Error(http.StatusServiceUnavailable, err)
		}
		if err := release.Eval(rctx, h.rdb, []string{key}, token).Err(); err != nil {
			return caddyhttp.Error(http.StatusServiceUnavailable, err)
		}
	}
	if nextErr != nil {
		return nextErr
	}
	return rec.WriteResponse()
}

// send sends cmd alone on the client when no other command is in flight,
// else through the autopipeliner.
func (h *Handler) send(ctx context.Context, cmd redis.Cmder) error {
	defer h.busy.Add(-1)
	if h.busy.Add(1) == 1 {
		return h.rdb.Process(ctx, cmd)
	}
	return h.ap.Submit(ctx, cmd).WaitContext(ctx)
}

// parseCaddyfile reads `redis_lock_floor <host:port>`.
func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	var f Handler
	if err := f.UnmarshalCaddyfile(h.Dispenser); err != nil {
		return nil, err
	}
	return &f, nil
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next()
	if !d.Args(&h.Address) || d.NextArg() {
		return d.ArgErr()
	}
	return nil
}

var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
	_ caddyfile.Unmarshaler       = (*Handler)(nil)
)
