"""Drives stripe-python against a Caddy site, for sdk_python_test.go.

    python3 run.py <base URL> < cases.json

cases.json: {"maxNetworkRetries": n, "cases": [case, ...]}, where a case is
{"name", "account", "key", "params", "background", "awaitBackground",
"pauseMs"}: a stripe.PaymentIntent.create call with the Stripe-Account and
Idempotency-Key given. A background call runs in a thread that is not joined
before the next case starts; awaitBackground joins every background call
before this one starts; pauseMs waits after starting the case. Prints one
JSON array, a result per case, in the order of the cases:
{"name", "attempts", "ok", "status", "object": {...}, "replayed",
"error": {...}, "exception": {...}}, as run.js does for stripe-node.

    python3 run.py --version

prints the stripe-python version and exits.

Written against stripe-python 5.0.0 (Debian bookworm's python3-stripe): its
module-level configuration (stripe.api_base, stripe.max_network_retries,
stripe.default_http_client) and its stripe.error classes.
"""

import json
import sys
import threading
import time

import stripe

try:
    from stripe.version import VERSION
except ImportError:  # later releases
    VERSION = getattr(stripe, "VERSION", "unknown")


def counting_client(base):
    """An HTTP client of stripe-python's default class, counting every
    request it sends (retries included) by Idempotency-Key: what stripe-node's
    "request" event gives run.js."""

    class CountingClient(base):
        def __init__(self, *args, **kwargs):
            super(CountingClient, self).__init__(*args, **kwargs)
            self.attempts = {}
            self.attempts_lock = threading.Lock()

        def request(self, method, url, headers, post_data=None):
            key = headers.get("Idempotency-Key")
            with self.attempts_lock:
                self.attempts[key] = self.attempts.get(key, 0) + 1
            return super(CountingClient, self).request(
                method, url, headers, post_data
            )

        def count(self, key):
            with self.attempts_lock:
                return self.attempts.get(key, 0)

    return CountingClient


def main():
    if sys.argv[1:] == ["--version"]:
        print(VERSION)
        return
    base = sys.argv[1]
    data = json.load(sys.stdin)

    stripe.api_key = "sk_test_caddy_redis_lock"
    stripe.api_base = base
    # 0 unless set (stripe/__init__.py); set as run.js sets maxNetworkRetries.
    stripe.max_network_retries = data["maxNetworkRetries"]
    stripe.enable_telemetry = False
    # The class stripe-python picks (RequestsClient when requests is
    # installed), counting its requests.
    default_class = type(stripe.http_client.new_default_http_client())
    client = counting_client(default_class)()
    stripe.default_http_client = client

    def run(c):
        before = client.count(c["key"])
        out = {"name": c["name"]}
        try:
            pi = stripe.PaymentIntent.create(
                stripe_account=c["account"],
                idempotency_key=c["key"],
                **c["params"]
            )
            resp = pi.last_response
            out["ok"] = True
            out["status"] = resp.code
            out["object"] = {
                k: pi.get(k)
                for k in ("id", "object", "amount", "status", "description")
            }
            out["replayed"] = (
                resp.headers.get("idempotent-replayed") == "true"
            )
        except stripe.error.StripeError as e:
            # The error object stripe-python parsed from the body's error
            # member (None when the body had none).
            err = e.error or {}
            headers = e.headers or {}
            out["ok"] = False
            out["error"] = {
                "class": type(e).__name__,
                "rawType": err.get("type") or "",
                "code": err.get("code") or "",
                "message": e.user_message or "",
                "declineCode": err.get("decline_code") or "",
                "charge": err.get("charge") or "",
                "statusCode": e.http_status or 0,
                "replayed": headers.get("idempotent-replayed") == "true",
                "shouldRetry": headers.get("stripe-should-retry") or "",
            }
            # What the exception itself carries: its module, and its code
            # attribute (stripe-python sets it for some classes only).
            out["exception"] = {
                "module": type(e).__module__,
                "code": e.code,
            }
        out["attempts"] = client.count(c["key"]) - before
        return out

    cases = data["cases"]
    results = [None] * len(cases)
    background = []

    def start(i, c):
        def target():
            try:
                results[i] = run(c)
            except BaseException as e:  # reported as a missing result
                sys.stderr.write("%s: %r\n" % (c["name"], e))

        t = threading.Thread(target=target, name=c["name"])
        t.start()
        return t

    for i, c in enumerate(cases):
        if c.get("awaitBackground"):
            for t in background:
                t.join()
        t = start(i, c)
        if c.get("background"):
            background.append(t)
        else:
            t.join()
        if c.get("pauseMs"):
            time.sleep(c["pauseMs"] / 1000.0)
    for t in background:
        t.join()
    if any(r is None for r in results):
        sys.exit("some calls raised outside stripe.error.StripeError")
    json.dump(results, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
