package redislock

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

func TestUnmarshalCaddyfile(t *testing.T) {
	d := func(v time.Duration) caddy.Duration { return caddy.Duration(v) }
	tests := []struct {
		name  string
		input string
		want  Handler
	}{
		{
			name:  "inline key",
			input: `redis_lock {http.request.header.Idempotency-Key}`,
			want:  Handler{Key: "{http.request.header.Idempotency-Key}"},
		},
		{
			name:  "inline key with block",
			input: "redis_lock k {\n ttl 3s\n}",
			want:  Handler{Key: "k", TTL: d(3 * time.Second)},
		},
		{
			name: "every option",
			input: `redis_lock {
				key            order:{http.redis_lock.json.order_id}
				ttl            30s
				renew          5s
				wait           250ms
				prefix         app:
				scope          {http.request.header.Authorization}
				missing_key    pass
				on_error       fail_open
				lost_lock      continue
				fencing_header X-Fence
				max_body       1MiB
				errors         handle_errors
				redis 10.0.0.1:6379 {
					mode              standalone
					master_name       mymaster
					username          app
					password          {env.REDIS_PASSWORD}
					sentinel_password s3cret
					db                2
					tls {
						ca                   /ca.pem
						cert                 /c.pem
						key                  /k.pem
						server_name          redis.internal
						insecure_skip_verify
					}
					dial_timeout      3s
					timeout           500ms
					pool_size         20
					replicas          1
				}
				idempotency {
					retention    1h
					fingerprint  method path header X-Tenant body
					max_response 2MB
					store        2xx 409
				}
			}`,
			want: Handler{
				Key: "order:{http.redis_lock.json.order_id}", TTL: d(30 * time.Second), Renew: d(5 * time.Second),
				Wait: d(250 * time.Millisecond), Prefix: "app:", Scope: "{http.request.header.Authorization}",
				MissingKey: "pass", OnError: "fail_open", LostLock: "continue", FencingHeader: "X-Fence",
				MaxBody: 1 << 20, Errors: "handle_errors",
				Redis: &RedisConfig{
					Addresses: []string{"10.0.0.1:6379"}, Mode: "standalone", MasterName: "mymaster",
					Username: "app", Password: "{env.REDIS_PASSWORD}", SentinelPassword: "s3cret", DB: 2,
					TLS:         &RedisTLS{CA: "/ca.pem", Cert: "/c.pem", Key: "/k.pem", ServerName: "redis.internal", InsecureSkipVerify: true},
					DialTimeout: d(3 * time.Second), Timeout: d(500 * time.Millisecond), PoolSize: 20, Replicas: 1,
				},
				Idempotency: &IdempotencyConfig{
					Retention: d(time.Hour), Fingerprint: []string{"method", "path", "body"},
					FingerprintHeaders: []string{"X-Tenant"}, MaxResponse: 2000000, Store: []string{"2xx", "409"},
				},
			},
		},
		{
			name:  "renew off, fencing header off, bare tls, address subdirective",
			input: "redis_lock k {\n renew off\n fencing_header off\n redis {\n address a:1\n tls\n }\n}",
			want: Handler{Key: "k", RenewOff: true, FencingHeaderOff: true,
				Redis: &RedisConfig{Addresses: []string{"a:1"}, TLS: &RedisTLS{}}},
		},
		{
			name:  "sizes are humanized like request_body",
			input: "redis_lock k {\n max_body 64KiB\n}",
			want:  Handler{Key: "k", MaxBody: 64 << 10},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got Handler
			if err := got.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tt.input)); err != nil {
				t.Fatalf("UnmarshalCaddyfile: %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestUnmarshalCaddyfileErrors(t *testing.T) {
	tests := []struct {
		name, input, want string
	}{
		{"no key", "redis_lock", "(inline or with the key subdirective), at Testfile:1"},
		{"no key in block", "redis_lock {\n ttl 1s\n}", "key is required"},
		{"two inline args", "redis_lock a b", "wrong argument count"},
		{"key inline and in block", "redis_lock a {\n key b\n}", "key given more than once, at Testfile:2"},
		{"unknown subdirective", "redis_lock k {\n ttl 1s\n\n bogus 1\n}", `unrecognized subdirective "bogus", at Testfile:4`},
		{"duplicate", "redis_lock k {\n ttl 1s\n ttl 2s\n}", "ttl given more than once, at Testfile:3"},
		{"missing arg", "redis_lock k {\n ttl\n}", "wrong argument count"},
		{"extra arg", "redis_lock k {\n ttl 1s 2s\n}", "wrong argument count"},
		{"bad duration", "redis_lock k {\n ttl soon\n}", `invalid duration "soon"`},
		{"bad renew", "redis_lock k {\n renew never\n}", `invalid duration "never"`},
		{"bad size", "redis_lock k {\n max_body lots\n}", `invalid size "lots"`},
		{"zero size", "redis_lock k {\n max_body 0\n}", "out of range"},
		{"bad enum", "redis_lock k {\n missing_key ignore\n}", `invalid value "ignore"`},
		{"bad on_error", "redis_lock k {\n on_error retry\n}", `invalid value "retry"`},
		{"bad errors", "redis_lock k {\n errors html\n}", `invalid value "html"`},
		{"redis unknown", "redis_lock k {\n redis {\n cluster_mode yes\n }\n}", `redis: unrecognized subdirective "cluster_mode", at Testfile:3`},
		{"redis duplicate", "redis_lock k {\n redis {\n db 1\n db 2\n }\n}", "redis: db given more than once, at Testfile:4"},
		{"redis inline and address", "redis_lock k {\n redis a:1 {\n address b:2\n }\n}", "both inline and with address"},
		{"redis bad db", "redis_lock k {\n redis {\n db x\n }\n}", `"x" is not a non-negative integer`},
		{"redis bad mode", "redis_lock k {\n redis {\n mode mesh\n }\n}", `invalid value "mesh"`},
		{"redis duplicate block", "redis_lock k {\n redis\n redis\n}", "redis given more than once, at Testfile:3"},
		{"tls unknown", "redis_lock k {\n redis {\n tls {\n verify no\n }\n }\n}", `tls: unrecognized subdirective "verify", at Testfile:4`},
		{"tls arg", "redis_lock k {\n redis {\n tls yes\n }\n}", "wrong argument count"},
		{"idempotency unknown", "redis_lock k {\n idempotency {\n ttl 1h\n }\n}", `idempotency: unrecognized subdirective "ttl"`},
		{"fingerprint part", "redis_lock k {\n idempotency {\n fingerprint cookie\n }\n}", `unknown fingerprint part "cookie"`},
		{"fingerprint header name", "redis_lock k {\n idempotency {\n fingerprint header\n }\n}", "needs a header name"},
		{"store teapot", "redis_lock k {\n idempotency {\n store 2xx teapot\n }\n}", `store "teapot" is neither a class`},
		{"store 1xx", "redis_lock k {\n idempotency {\n store 1xx\n }\n}", `store "1xx" is neither a class`},
		{"store 600", "redis_lock k {\n idempotency {\n store 600\n }\n}", `store "600" is neither a class`},
		{"store nothing", "redis_lock k {\n idempotency {\n store\n }\n}", "wrong argument count"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var h Handler
			err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tt.input))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error = %v, want one containing %q", err, tt.want)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name   string
		modify func(*Handler)
		want   string // "" means valid
	}{
		{"defaults", func(*Handler) {}, ""},
		{"no key", func(h *Handler) { h.Key = "" }, "key is required"},
		{"negative ttl", func(h *Handler) { h.TTL = -1 }, "ttl must be positive"},
		{"renew not below ttl", func(h *Handler) { h.Renew = h.TTL }, "must be shorter than ttl"},
		{"negative wait", func(h *Handler) { h.Wait = -1 }, "wait must not be negative"},
		{"negative max_body", func(h *Handler) { h.MaxBody = -1 }, "max_body must be positive"},
		{"bad enum", func(h *Handler) { h.OnError = "maybe" }, `on_error must be fail_closed or fail_open, got "maybe"`},
		{"bad header", func(h *Handler) { h.FencingHeader = "Fencing Token" }, "not a valid header name"},
		{"idempotency", func(h *Handler) { h.Idempotency = &IdempotencyConfig{}; h.Idempotency.applyDefaults() }, ""},
		{"idempotency retention", func(h *Handler) { h.Idempotency = &IdempotencyConfig{Retention: -1, MaxResponse: 1} }, "retention must be positive"},
		{"idempotency max_response", func(h *Handler) { h.Idempotency = &IdempotencyConfig{Retention: 1, MaxResponse: -1} }, "max_response must be positive"},
		{"idempotency part", func(h *Handler) {
			h.Idempotency = &IdempotencyConfig{Retention: 1, MaxResponse: 1, Fingerprint: []string{"cookie"}}
		}, `unknown fingerprint part "cookie"`},
		{"idempotency header", func(h *Handler) {
			h.Idempotency = &IdempotencyConfig{Retention: 1, MaxResponse: 1, FingerprintHeaders: []string{"Bad Name"}}
		}, "not a valid header name"},
		{"idempotency json", func(h *Handler) {
			h.Idempotency = &IdempotencyConfig{Retention: 1, MaxResponse: 1, Fingerprint: []string{"method", "json"}}
		}, ""},
		{"idempotency body and json", func(h *Handler) {
			h.Idempotency = &IdempotencyConfig{Retention: 1, MaxResponse: 1, Fingerprint: []string{"body", "json"}}
		}, "fingerprint body and json both compare the body"},
		{"replay_cookies without scope", func(h *Handler) {
			h.Idempotency = &IdempotencyConfig{Retention: 1, MaxResponse: 1, ReplayCookies: true}
		}, "replay_cookies needs a scope"},
		{"replay_cookies with scope", func(h *Handler) {
			h.Scope = "{http.request.cookie.session}"
			h.Idempotency = &IdempotencyConfig{Retention: 1, MaxResponse: 1, ReplayCookies: true}
		}, ""},
		{"cluster", func(h *Handler) { h.Redis.Mode = ModeCluster }, "cluster mode needs the address of at least one node"},
		{"sentinel", func(h *Handler) { h.Redis.Mode = ModeSentinel }, "sentinel mode needs master_name"},
		{"redlock", func(h *Handler) { h.Redis.Mode = ModeRedlock }, "redlock mode needs an odd number of independent masters"},
		{"two standalone addresses", func(h *Handler) { h.Redis.Addresses = []string{"a:1", "b:2"} }, "takes one address"},
		{"tls cert without key", func(h *Handler) { h.Redis.TLS = &RedisTLS{Cert: "c.pem"} }, "cert and key go together"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := Handler{Key: "k"}
			h.applyDefaults()
			tt.modify(&h)
			err := h.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error = %v, want one containing %q", err, tt.want)
			}
		})
	}
}

func TestApplyDefaults(t *testing.T) {
	h := Handler{Key: "k"}
	h.applyDefaults()
	if time.Duration(h.TTL) != 10*time.Second || h.Renew != 0 || h.Wait != 0 || h.Prefix != "redis_lock:" ||
		h.MissingKey != "reject" || h.OnError != "fail_closed" || h.LostLock != "abort" ||
		h.FencingHeader != "Fencing-Token" || h.MaxBody != 64<<10 || h.Errors != "respond" || h.Idempotency != nil {
		t.Errorf("defaults: %+v", h)
	}
	h = Handler{Key: "k", Idempotency: &IdempotencyConfig{}}
	h.applyDefaults()
	if c := h.Idempotency; time.Duration(c.Retention) != 24*time.Hour || c.MaxResponse != 1<<20 ||
		!reflect.DeepEqual(c.Fingerprint, []string{"method", "path", "query", "body"}) {
		t.Errorf("idempotency defaults: %+v", c)
	}
	h = Handler{Key: "k", Idempotency: &IdempotencyConfig{FingerprintHeaders: []string{"X-A"}}}
	h.applyDefaults()
	if len(h.Idempotency.Fingerprint) != 0 {
		t.Errorf("fingerprint headers alone: parts %v, want none", h.Idempotency.Fingerprint)
	}
	rc, err := h.Redis.resolve()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(rc.Addresses, []string{"127.0.0.1:6379"}) || rc.Mode != "standalone" ||
		time.Duration(rc.DialTimeout) != 2*time.Second || time.Duration(rc.Timeout) != time.Second {
		t.Errorf("redis defaults: %+v", rc)
	}
}
