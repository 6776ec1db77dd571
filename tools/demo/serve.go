package main

import (
	"fmt"
	"io"
	"strings"
)

// printTryIt prints the running Caddyfile and curl commands to try the demo
// by hand.
func printTryIt(out io.Writer, s caddySites, backend string) {
	fmt.Fprintf(out, "\nThe Caddyfile Caddy is running:\n\n%s", s.Caddyfile())
	charge := func(addr, order string, extra string) string {
		return fmt.Sprintf("curl -s -w '\\n' -X POST http://%s/charge -H 'Idempotency-Key: %s'%s -d '{\"order_id\":\"%s\",\"amount_cents\":1299}'",
			addr, order, extra, order)
	}
	fmt.Fprintf(out, `
Everything keeps running: try it by hand, then press Ctrl-C to stop.

# A charge through redis_lock; the reply shows the Fencing-Token the backend got:
%s

# A charge and its duplicate at the same moment: one is charged, the other gets
# 409 Conflict with Retry-After (the remaining lease) and a problem+json body:
for i in 1 2; do %s -i & done; wait

# The same pair through the plain route: both are charged (look for "double_charge"):
for i in 1 2; do %s & done; wait

# A late retry through redis_lock alone: the same request again once the
# first has been answered. The lock is free by then, so the backend charges
# it a second time (the second reply has "charge":2 and "double_charge":true):
%s
%s

# The same through redis_lock + idempotency: the retry gets the first reply
# back, with Idempotent-Replayed: true, and the backend is not called again;
# the key with another body is refused with 422:
%s
%s -i
%s -i

# Caddy's admin API shows the key's record (completed: the stored answer's
# status and size, and when it expires) and can clear it, as an operator
# clears an outcome-unknown charge once checked; the next retry is charged:
curl -s 'http://%[10]s/redis_lock/keys?name=idempotent&key=order-5'
curl -s -X DELETE 'http://%[10]s/redis_lock/keys?name=idempotent&key=order-5'
%[6]s

# A stale lock holder: straight to the backend with a fencing token lower than
# the one it accepted for order-1; the backend refuses it with 412:
%[9]s -i
`,
		charge(s.LockedAddr, "order-1", ""),
		charge(s.LockedAddr, "order-2", ""),
		charge(s.PlainAddr, "order-3", ""),
		charge(s.LockedAddr, "order-4", ""), charge(s.LockedAddr, "order-4", ""),
		charge(s.IdempotentAddr, "order-5", ""), charge(s.IdempotentAddr, "order-5", ""),
		strings.Replace(charge(s.IdempotentAddr, "order-5", ""), "1299", "999", 1),
		charge(backend, "order-1", " -H 'Fencing-Token: 1'"), s.AdminAddr)
}
