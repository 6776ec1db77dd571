package redislock

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"sync"

	"github.com/caddyserver/caddy/v2"
)

// registry holds every provisioned handler not yet cleaned up, of every
// config loaded. Admin modules are created with the admin server, not with
// a config, so the admin API finds handlers here: those of the active
// config (caddy.ActiveContext), which during a reload stays the old one
// until the new one has started, and never a config that failed to load.
var registry struct {
	sync.Mutex
	entries []registered
}

// registered is a handler and the config it belongs to.
type registered struct {
	h      *Handler
	config <-chan struct{} // its config context's Done: one per config
	conf   []byte          // its JSON config, to tell copies from others
}

// register adds h, provisioned with ctx, to the registry. A name is one
// handler of a config: it may be given again only to the same
// configuration (a snippet imported into several sites).
func register(ctx caddy.Context, h *Handler) error {
	conf, err := json.Marshal(h)
	if err != nil {
		return err
	}
	registry.Lock()
	defer registry.Unlock()
	for _, e := range registry.entries {
		if e.config == ctx.Done() && h.Name != "" && e.h.Name == h.Name && !bytes.Equal(e.conf, conf) {
			return fmt.Errorf("name %q is given to another redis_lock handler with a different configuration: names must be unique", h.Name)
		}
	}
	registry.entries = append(registry.entries, registered{h: h, config: ctx.Done(), conf: conf})
	return nil
}

// unregister removes h from the registry.
func unregister(h *Handler) {
	registry.Lock()
	defer registry.Unlock()
	registry.entries = slices.DeleteFunc(registry.entries, func(e registered) bool { return e.h == h })
}

// activeHandlers are the handlers of the active config, one of each
// configuration (copies of one, from a snippet imported into several
// sites, are one handler), in the order they were provisioned.
func activeHandlers() []*Handler {
	registry.Lock()
	defer registry.Unlock()
	return activeLocked()
}

// holdHandler is pick's choice among the active handlers, its Redis
// connection held (until unhold) before the registry is unlocked: a Cleanup
// that runs meanwhile unregisters first, and its connection then stays open
// until the hold ends.
func holdHandler(pick func([]*Handler) (*Handler, error)) (h *Handler, unhold func(), err error) {
	registry.Lock()
	defer registry.Unlock()
	if h, err = pick(activeLocked()); err != nil {
		return nil, nil, err
	}
	return h, h.conn.Hold(), nil
}

// activeLocked is activeHandlers with the registry locked.
func activeLocked() []*Handler {
	active := caddy.ActiveContext()
	if active.Context == nil {
		return nil
	}
	var out []*Handler
	var confs [][]byte
	for _, e := range registry.entries {
		if e.config != active.Done() || slices.ContainsFunc(confs, func(c []byte) bool { return bytes.Equal(c, e.conf) }) {
			continue
		}
		out = append(out, e.h)
		confs = append(confs, e.conf)
	}
	return out
}
