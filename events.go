package redislock

import (
	"errors"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
)

// The Caddy events the handler emits.
const (
	eventLockLost         = "lock_lost"         // a lock lost while its request was in flight
	eventOutcomeUnknown   = "outcome_unknown"   // an outcome-unknown record stored
	eventRedisUnavailable = "redis_unavailable" // a request Redis failed: 503, or passed on with fail_open
)

// events emits the handler's Caddy events through the events app, with the
// handler's own context, so that their origin is the handler. Each kind is
// rate-limited as the log's warnings are (one a second, the next one
// saying how many were held back: "suppressed"), and each is emitted in a
// goroutine of its own: a subscriber never holds back a client's answer.
type events struct {
	app    *caddyevents.App
	ctx    caddy.Context
	limits map[string]*rateLimitedWarn
}

// newEvents finds the events app, which the HTTP app loads before it
// provisions its handlers; nil (no events) for a handler provisioned
// outside one.
func newEvents(ctx caddy.Context) (*events, error) {
	app, err := ctx.AppIfConfigured("events")
	if errors.Is(err, caddy.ErrNotConfigured) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	e := &events{app: app.(*caddyevents.App), ctx: ctx, limits: map[string]*rateLimitedWarn{}}
	for _, name := range []string{eventLockLost, eventOutcomeUnknown, eventRedisUnavailable} {
		e.limits[name] = new(rateLimitedWarn)
	}
	return e, nil
}

// emit sends the event name with the keys, the fencing token (0: none) and
// the request's result, unless nothing listens or one went out less than a
// second ago.
func (e *events) emit(name, redisKey, recordKey string, fence int64, result string) {
	if e == nil || !e.app.ShouldEmit(name) {
		return
	}
	ok, suppressed := e.limits[name].allow()
	if !ok {
		return
	}
	data := map[string]any{
		"redis_key":     redisKey,
		"record_key":    recordKey,
		"fencing_token": fence,
		"result":        result,
	}
	if suppressed > 0 {
		data["suppressed"] = suppressed
	}
	go e.app.Emit(e.ctx, name, data)
}
