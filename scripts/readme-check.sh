#!/usr/bin/env bash
# Runs the README's first screen as a user would: ./caddy (make caddy) with
# the first ```caddyfile block of README.md, a redis-server and a slow
# backend. Two overlapping requests with the same Idempotency-Key: the first
# reaches the backend and gets 200, the second gets 409 with Retry-After, and
# the backend runs once; a request without the header gets 400.
#
# The Caddyfile is used as the README prints it. Only its addresses change,
# to free ports: the site's :8080, Redis's 127.0.0.1:6379 and the backend's
# 127.0.0.1:9000. A global options block turns the admin endpoint off and
# keeps Caddy's state in a temporary folder.
#
# Needs ./caddy (or CADDY=path), redis-server, python3 and curl.
set -euo pipefail
cd "$(dirname "$0")/.."

CADDY="${CADDY:-./caddy}"
HOLD="${HOLD:-3}" # seconds the backend takes per request

fail() {
	echo "readme-check: FAIL: $*" >&2
	exit 1
}

[ -x "$CADDY" ] || fail "$CADDY is missing: run make caddy"
for tool in redis-server python3 curl; do
	command -v "$tool" >/dev/null || fail "$tool is missing"
done

tmp="$(mktemp -d)"
pids=()
cleanup() {
	local status=$?
	for pid in "${pids[@]}"; do
		kill "$pid" 2>/dev/null || true
	done
	for pid in "${pids[@]}"; do
		wait "$pid" 2>/dev/null || true
	done
	if [ "$status" -ne 0 ]; then
		for log in "$tmp"/*.log; do
			[ -s "$log" ] && { echo "--- $log"; tail -n 20 "$log"; }
		done
	fi
	rm -rf "$tmp"
	exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
	python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# until <seconds> <command...>: runs the command every 0.1s until it
# succeeds; fails after the given time.
until_ok() {
	local deadline=$((SECONDS + $1))
	shift
	until "$@" >/dev/null 2>&1; do
		[ "$SECONDS" -lt "$deadline" ] || return 1
		sleep 0.1
	done
}

alive() { kill -0 "$1" 2>/dev/null; }

# The README's first Caddyfile.
awk '/^```caddyfile$/ { inside = 1; next } inside && /^```$/ { exit } inside { print }' README.md >"$tmp/readme.caddyfile"
[ -s "$tmp/readme.caddyfile" ] || fail "README.md has no caddyfile block"
echo "readme-check: the README's first Caddyfile:"
sed 's/^/    /' "$tmp/readme.caddyfile"
for s in ':8080 {' '127.0.0.1:6379' '127.0.0.1:9000' '{http.request.header.Idempotency-Key}'; do
	grep -qF -- "$s" "$tmp/readme.caddyfile" || fail "the README's first Caddyfile has no '$s' (this script replaces or relies on it)"
done

# A slow backend: it notes each request, then answers after HOLD seconds.
cat >"$tmp/backend.py" <<'EOF'
import os, sys, threading, time
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler

hold, seen_file, port_file = float(sys.argv[1]), sys.argv[2], sys.argv[3]
lock = threading.Lock()

class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with lock, open(seen_file, "a") as f:
            f.write(self.headers.get("Idempotency-Key", "") + "\n")
        time.sleep(hold)
        body = b'{"charged":true}\n'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
with open(port_file + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
os.rename(port_file + ".tmp", port_file)
server.serve_forever()
EOF
: >"$tmp/seen"
python3 "$tmp/backend.py" "$HOLD" "$tmp/seen" "$tmp/backend.port" >"$tmp/backend.log" 2>&1 &
pids+=($!)
until_ok 10 test -s "$tmp/backend.port" || fail "the backend did not start"
backend_port="$(cat "$tmp/backend.port")"

# Redis on a free port (another one if that port is taken meanwhile).
redis_ping() (
	exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
	printf 'PING\r\n' >&3
	IFS= read -r -t 2 reply <&3 && [[ $reply == +PONG* ]]
)
redis_port=""
for _ in 1 2 3; do
	port="$(free_port)"
	redis-server --bind 127.0.0.1 --port "$port" --save '' --appendonly no \
		--maxmemory-policy noeviction >"$tmp/redis.log" 2>&1 &
	pid=$!
	pids+=("$pid")
	if until_ok 10 redis_ping "$port"; then
		redis_port="$port"
		break
	fi
	kill "$pid" 2>/dev/null || true
done
[ -n "$redis_port" ] || fail "redis-server did not start"

# Caddy with the README's Caddyfile on a free port.
export XDG_DATA_HOME="$tmp/data" XDG_CONFIG_HOME="$tmp/config"
caddy_ready() { [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://127.0.0.1:$1/")" != 000 ]; }
caddy_port=""
for _ in 1 2 3; do
	port="$(free_port)"
	{
		printf '{\n\tadmin off\n\tpersist_config off\n}\n\n'
		sed -e "s/:8080 {/:$port {/" \
			-e "s/127\.0\.0\.1:6379/127.0.0.1:$redis_port/" \
			-e "s/127\.0\.0\.1:9000/127.0.0.1:$backend_port/" "$tmp/readme.caddyfile"
	} >"$tmp/Caddyfile"
	"$CADDY" run --config "$tmp/Caddyfile" --adapter caddyfile >"$tmp/caddy.log" 2>&1 &
	pid=$!
	pids+=("$pid")
	for _ in $(seq 150); do
		caddy_ready "$port" && { caddy_port="$port"; break; }
		alive "$pid" || break
		sleep 0.1
	done
	[ -n "$caddy_port" ] && break
	kill "$pid" 2>/dev/null || true
done
[ -n "$caddy_port" ] || fail "caddy did not start with the README's Caddyfile"
url="http://127.0.0.1:$caddy_port/charge"
echo "readme-check: caddy on :$caddy_port, redis on :$redis_port, a backend taking ${HOLD}s on :$backend_port"

# No key: 400.
status="$(curl -s -o /dev/null -w '%{http_code}' --max-time 10 -X POST "$url")"
[ "$status" = 400 ] || fail "a request without Idempotency-Key got $status, want 400"
echo "readme-check: no Idempotency-Key: $status"

# Two requests with one key: the second is sent while the first is at the
# backend.
key="readme-check-$$"
curl -s -o "$tmp/first.body" -w '%{http_code}' --max-time 30 -X POST \
	-H "Idempotency-Key: $key" -H 'Content-Type: application/json' -d '{"amount":100}' \
	"$url" >"$tmp/first.status" &
first=$!
pids+=("$first")
until_ok 10 grep -qx "$key" "$tmp/seen" || fail "the first request never reached the backend"
second="$(curl -s -D "$tmp/second.headers" -o "$tmp/second.body" -w '%{http_code}' --max-time 10 -X POST \
	-H "Idempotency-Key: $key" -H 'Content-Type: application/json' -d '{"amount":100}' "$url")"
wait "$first" || fail "the first request failed (curl exit $?)"
first_status="$(cat "$tmp/first.status")"
echo "readme-check: two requests with Idempotency-Key $key: $first_status and $second"

[ "$first_status" = 200 ] || fail "the first request got $first_status, want 200"
[ "$second" = 409 ] || fail "the second request got $second, want 409: $(cat "$tmp/second.body")"
grep -qi '^retry-after: [1-9]' "$tmp/second.headers" || fail "the 409 has no Retry-After"
grep -qi '^content-type: application/problem+json' "$tmp/second.headers" || fail "the 409 is not problem+json"
runs="$(grep -cx "$key" "$tmp/seen" || true)"
[ "$runs" = 1 ] || fail "the backend ran the request $runs times, want once"
echo "readme-check: the 409: $(tr -d '\r' <"$tmp/second.headers" | grep -i '^retry-after'); $(cat "$tmp/second.body")"
echo "readme-check: the backend ran it once. OK"
