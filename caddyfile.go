package redislock

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/dustin/go-humanize"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("redis_lock", parseCaddyfile)
	// Authentication runs first (a rejected request never takes a lock), and
	// the lock wraps handle, route and reverse_proxy.
	httpcaddyfile.RegisterDirectiveOrder("redis_lock", httpcaddyfile.After, "forward_auth")
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	var hd Handler
	err := hd.UnmarshalCaddyfile(h.Dispenser)
	return &hd, err
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	redis_lock [<matcher>] [<key>] {
//		name           <string>
//		key            <template>
//		ttl            <duration>
//		renew          <duration>|off
//		wait           <duration>
//		prefix         <string>
//		scope          <template>
//		missing_key    reject|pass
//		on_error       fail_closed|fail_open
//		lost_lock      abort|continue
//		fencing_header <name>|off
//		max_body       <size>
//		errors         respond|handle_errors
//		redis [<address>...] {
//			address           <host:port>...
//			mode              standalone|cluster|sentinel|redlock
//			master_name       <name>
//			username          <user>
//			password          <password>
//			sentinel_username <user>
//			sentinel_password <password>
//			db                <n>
//			tls               [{ ca <file>; cert <file>; key <file>; server_name <name>; insecure_skip_verify }]
//			dial_timeout      <duration>
//			timeout           <duration>
//			pool_size         <n>
//			replicas          <n>
//		}
//		idempotency {
//			key          <template>
//			retention    <duration>
//			fingerprint  <part>...
//			max_response <size>
//			store        <class|status>...
//			replay_cookies
//		}
//	}
//
// The key is required, inline or in the block (not both). Unknown or
// repeated subdirectives are errors.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	file, line := d.File(), d.Line()
	if d.NextArg() {
		h.Key = d.Val()
		if d.NextArg() {
			return d.ArgErr()
		}
	}
	inlineKey := h.Key != ""
	err := parseBlock(d, "", func(name string) (err error) {
		if name == "key" && inlineKey {
			return d.Errf("key given more than once")
		}
		switch name {
		case "name":
			err = oneArg(d, &h.Name)
		case "key":
			err = oneArg(d, &h.Key)
		case "ttl":
			err = durationArg(d, &h.TTL)
		case "renew":
			if err = oneArg(d, new(string)); err == nil && d.Val() == "off" {
				h.RenewOff = true
			} else if err == nil {
				err = parseDuration(d, &h.Renew)
			}
		case "wait":
			err = durationArg(d, &h.Wait)
		case "prefix":
			err = oneArg(d, &h.Prefix)
		case "scope":
			err = oneArg(d, &h.Scope)
		case "missing_key":
			err = enumArg(d, &h.MissingKey, MissingKeyReject, MissingKeyPass)
		case "on_error":
			err = enumArg(d, &h.OnError, OnErrorFailClosed, OnErrorFailOpen)
		case "lost_lock":
			err = enumArg(d, &h.LostLock, LostLockAbort, LostLockContinue)
		case "errors":
			err = enumArg(d, &h.Errors, ErrorsRespond, ErrorsHandleErrors)
		case "fencing_header":
			if err = oneArg(d, &h.FencingHeader); err == nil && h.FencingHeader == "off" {
				h.FencingHeader, h.FencingHeaderOff = "", true
			}
		case "max_body":
			err = sizeArg(d, &h.MaxBody)
		case "redis":
			h.Redis = new(RedisConfig)
			err = h.Redis.unmarshalCaddyfile(d)
		case "idempotency":
			h.Idempotency = new(IdempotencyConfig)
			err = h.Idempotency.unmarshalCaddyfile(d)
		default:
			return errUnknownSubdirective
		}
		return err
	})
	if err != nil {
		return err
	}
	if h.Key == "" {
		// Reported at the directive's line, not at its closing brace.
		return fmt.Errorf("a key is required (inline or with the key subdirective), at %s:%d", file, line)
	}
	return nil
}

// unmarshalCaddyfile parses `redis [<address>...] { ... }`.
func (c *RedisConfig) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	c.Addresses = d.RemainingArgs()
	return parseBlock(d, "redis", func(name string) (err error) {
		switch name {
		case "address":
			if len(c.Addresses) > 0 {
				return d.Err("redis: addresses given both inline and with address")
			}
			if c.Addresses = d.RemainingArgs(); len(c.Addresses) == 0 {
				return d.ArgErr()
			}
		case "mode":
			err = enumArg(d, &c.Mode, ModeStandalone, ModeCluster, ModeSentinel, ModeRedlock)
		case "master_name":
			err = oneArg(d, &c.MasterName)
		case "username":
			err = oneArg(d, &c.Username)
		case "password":
			err = oneArg(d, &c.Password)
		case "sentinel_username":
			err = oneArg(d, &c.SentinelUsername)
		case "sentinel_password":
			err = oneArg(d, &c.SentinelPassword)
		case "db":
			err = intArg(d, &c.DB)
		case "tls":
			c.TLS = new(RedisTLS)
			err = c.TLS.unmarshalCaddyfile(d)
		case "dial_timeout":
			err = durationArg(d, &c.DialTimeout)
		case "timeout":
			err = durationArg(d, &c.Timeout)
		case "pool_size":
			err = intArg(d, &c.PoolSize)
		case "replicas":
			err = intArg(d, &c.Replicas)
		default:
			return errUnknownSubdirective
		}
		return err
	})
}

// unmarshalCaddyfile parses `tls [{ ... }]`.
func (t *RedisTLS) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		return d.ArgErr()
	}
	return parseBlock(d, "tls", func(name string) (err error) {
		switch name {
		case "ca":
			err = oneArg(d, &t.CA)
		case "cert":
			err = oneArg(d, &t.Cert)
		case "key":
			err = oneArg(d, &t.Key)
		case "server_name":
			err = oneArg(d, &t.ServerName)
		case "insecure_skip_verify":
			if d.NextArg() {
				err = d.ArgErr()
			}
			t.InsecureSkipVerify = true
		default:
			return errUnknownSubdirective
		}
		return err
	})
}

// unmarshalCaddyfile parses `idempotency { ... }`.
func (c *IdempotencyConfig) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		return d.ArgErr()
	}
	return parseBlock(d, "idempotency", func(name string) (err error) {
		switch name {
		case "key":
			err = oneArg(d, &c.Key)
		case "retention":
			err = durationArg(d, &c.Retention)
		case "max_response":
			err = sizeArg(d, &c.MaxResponse)
		case "fingerprint":
			err = c.parseFingerprint(d)
		case "replay_cookies":
			if d.NextArg() {
				return d.ArgErr()
			}
			c.ReplayCookies = true
		case "store":
			c.Store = append(c.Store, d.RemainingArgs()...)
			if len(c.Store) == 0 {
				return d.ArgErr()
			}
			if _, perr := parseStorePolicy(c.Store); perr != nil {
				return d.Err(perr.Error())
			}
		default:
			return errUnknownSubdirective
		}
		return err
	})
}

// parseFingerprint parses `fingerprint <part>...`: method, path, query,
// body, and `header <name>`.
func (c *IdempotencyConfig) parseFingerprint(d *caddyfile.Dispenser) error {
	args := d.RemainingArgs()
	if len(args) == 0 {
		return d.ArgErr()
	}
	for i := 0; i < len(args); i++ {
		switch args[i] {
		case "method", "path", "query", "body", "json":
			c.Fingerprint = append(c.Fingerprint, args[i])
		case "header":
			if i+1 >= len(args) {
				return d.Err("idempotency: fingerprint header needs a header name")
			}
			i++
			c.FingerprintHeaders = append(c.FingerprintHeaders, args[i])
		default:
			return d.Errf("idempotency: unknown fingerprint part %q (want method, path, query, body, json or header <name>)", args[i])
		}
	}
	return nil
}

// errUnknownSubdirective is what a parseBlock callback returns for a name it
// does not know.
var errUnknownSubdirective = errors.New("unknown subdirective")

// parseBlock calls parse for each subdirective of the block that starts at
// the current token, rejecting repeated and unknown ones. what prefixes the
// messages ("redis: ..."); it is empty for the directive's own block.
func parseBlock(d *caddyfile.Dispenser, what string, parse func(name string) error) error {
	prefix := ""
	if what != "" {
		prefix = what + ": "
	}
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		if seen[name] {
			return d.Errf("%s%s given more than once", prefix, name)
		}
		seen[name] = true
		if err := parse(name); errors.Is(err, errUnknownSubdirective) {
			return d.Errf("%sunrecognized subdirective %q", prefix, name)
		} else if err != nil {
			return err
		}
	}
	return nil
}

// oneArg reads exactly one argument into dst.
func oneArg(d *caddyfile.Dispenser, dst *string) error {
	if !d.AllArgs(dst) {
		return d.ArgErr()
	}
	return nil
}

func durationArg(d *caddyfile.Dispenser, dst *caddy.Duration) error {
	if err := oneArg(d, new(string)); err != nil {
		return err
	}
	return parseDuration(d, dst)
}

// parseDuration parses the current token as a duration.
func parseDuration(d *caddyfile.Dispenser, dst *caddy.Duration) error {
	v, err := caddy.ParseDuration(d.Val())
	if err != nil {
		return d.Errf("invalid duration %q: %v", d.Val(), err)
	}
	*dst = caddy.Duration(v)
	return nil
}

func sizeArg(d *caddyfile.Dispenser, dst *int64) error {
	var s string
	if err := oneArg(d, &s); err != nil {
		return err
	}
	v, err := humanize.ParseBytes(s)
	if err != nil {
		return d.Errf("invalid size %q (want a number of bytes with a unit, such as 64KiB or 1MB)", s)
	}
	if v == 0 || v > 1<<62 {
		return d.Errf("size %q out of range", s)
	}
	*dst = int64(v)
	return nil
}

func intArg(d *caddyfile.Dispenser, dst *int) error {
	var s string
	if err := oneArg(d, &s); err != nil {
		return err
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < 0 {
		return d.Errf("%q is not a non-negative integer", s)
	}
	*dst = v
	return nil
}

// enumArg reads one argument that must be one of allowed.
func enumArg(d *caddyfile.Dispenser, dst *string, allowed ...string) error {
	var s string
	if err := oneArg(d, &s); err != nil {
		return err
	}
	for _, a := range allowed {
		if s == a {
			*dst = s
			return nil
		}
	}
	return d.Errf("invalid value %q (want one of %v)", s, allowed)
}

var _ caddyfile.Unmarshaler = (*Handler)(nil)
