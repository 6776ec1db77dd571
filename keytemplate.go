package redislock

import (
	"strings"

	"github.com/caddyserver/caddy/v2"
)

// template is a key or scope template of Caddy placeholders.
type template struct {
	raw      string
	usesJSON bool // needs the request body
}

func parseTemplate(s string) template {
	return template{raw: s, usesJSON: strings.Contains(s, "{"+jsonPrefix)}
}

// expand replaces the placeholders in t. missing is true when any of them
// expanded to nothing (unknown placeholders included), so that
// "order:{http.redis_lock.json.order_id}" without an order id never becomes
// the shared lock "order:".
func (t template) expand(repl *caddy.Replacer) (out string, missing bool, err error) {
	if t.raw == "" {
		return "", false, nil
	}
	out, err = repl.ReplaceFunc(t.raw, func(_ string, val any) (any, error) {
		if caddy.ToString(val) == "" {
			missing = true
		}
		return val, nil
	})
	return out, missing, err
}
