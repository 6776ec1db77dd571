#!/usr/bin/env bash
# Load-test comparison of this tree's Caddy build with another revision's:
# does a change cost throughput? Absolute req/s on a shared machine move by
# 10% and more from one minute to the next, so two builds measured an hour
# apart cannot be compared; this measures them side by side.
#
#   scripts/loadtest-compare.sh REV     (make loadtest-compare REV=...)
#
# REV is built from a temporary git worktree. One redis-server and one
# upstream serve both builds; only one Caddy runs at a time. Each round
# starts each build in turn (which goes first alternates), warms it up, runs
# its plain and its redis_lock site (order alternating) with wrk, distinct
# keys, and stops it. The summary gives the medians of req/s and of the
# per-round ratios: locked/plain of each build (what make loadtest reports)
# and this tree's locked against REV's.
#
# Then latency at a constant rate (bench/latency, open loop): each round
# starts each build in turn and runs its plain, locked and idempotency sites
# at each rate; the summary gives, per build, the medians of p50 and p99 and
# of their ratios to plain in the same run.
#
# Knobs: LOADTEST_ROUNDS (default 8; 0: latency only), LOADTEST_DURATION (10s),
# LOADTEST_WARMUP (2s), LOADTEST_CONNECTIONS (64), LOADTEST_THREADS (CPUs),
# LOADTEST_BODY_SIZE (100); LOADTEST_LATENCY_RATES (500; "" skips the
# latency runs), LOADTEST_LATENCY_DURATION (10s), LOADTEST_LATENCY_ROUNDS (3).
set -euo pipefail
cd "$(dirname "$0")/.."

rev=${1:?usage: $0 REV (a git revision to compare this tree with)}
rounds=${LOADTEST_ROUNDS:-8}
duration=${LOADTEST_DURATION:-10s}
warmup=${LOADTEST_WARMUP:-2s}
conns=${LOADTEST_CONNECTIONS:-64}
threads=${LOADTEST_THREADS:-$(nproc)}
body_size=${LOADTEST_BODY_SIZE:-100}

for tool in redis-server wrk go git; do
	command -v "$tool" >/dev/null || {
		echo "$tool not found (redis-server: make redis; wrk: apt-get install -y wrk)" >&2
		exit 1
	}
done
git rev-parse --verify -q "$rev^{commit}" >/dev/null || {
	echo "$rev is not a revision of this repository" >&2
	exit 1
}

work=$(mktemp -d)
pids=()
cleanup() {
	local pid
	for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
	for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
	git worktree remove --force "$work/rev" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

source scripts/loadtest/ports.sh

echo "building caddy from this tree and from $rev ($(git rev-parse --short "$rev"))"
go build -o "$work/caddy-this" ./cmd/caddy
git worktree add -q --detach "$work/rev" "$rev"
(cd "$work/rev" && go build -o "$work/caddy-rev" ./cmd/caddy)
(cd tools && go build -o "$work/upstream" ./loadupstream)
(cd bench && go build -o "$work/latency" ./latency)

redis_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
	--daemonize no --loglevel warning --dir "$work" >"$work/redis.log" 2>&1 &
pids+=($!)
wait_port "$redis_port" redis-server
"$work/upstream" -addr 127.0.0.1:0 -size "$body_size" >"$work/upstream.out" 2>&1 &
pids+=($!)
for _ in $(seq 150); do
	[ -s "$work/upstream.out" ] && break
	sleep 0.1
done
upstream=$(head -n1 "$work/upstream.out")

# wrk_rps URL DURATION: req/s of one wrk run; fails on non-2xx answers or
# socket errors (distinct keys: nothing may conflict).
wrk_rps() {
	local out
	out=$(wrk -t"$threads" -c"$conns" -d"$2" -s scripts/loadtest/keys.lua "$1" -- "cmp$RANDOM$RANDOM")
	if grep -qE 'Non-2xx|Socket errors' <<<"$out"; then
		echo "$1: $(grep -E 'Non-2xx|Socket errors' <<<"$out")" >&2
		return 1
	fi
	awk '/^Requests\/sec:/ {print $2}' <<<"$out"
}

echo "wrk -t$threads -c$conns -d$duration, $rounds rounds, one Caddy at a time"
results=$work/results
# start_caddy BUILD: runs that build's Caddy on new ports; sets caddy_pid
# and port[plain|locked|idem].
declare -A port
start_caddy() {
	local p
	port=()
	for s in plain locked idem; do
		p=$(free_port)
		while [[ " ${port[*]} " == *" $p "* ]]; do p=$(free_port); done
		port[$s]=$p
	done
	LT_PLAIN_PORT=${port[plain]} LT_LOCKED_PORT=${port[locked]} LT_IDEM_PORT=${port[idem]} \
		LT_UPSTREAM=$upstream LT_REDIS=127.0.0.1:$redis_port \
		"$work/caddy-$1" run --adapter caddyfile --config scripts/loadtest/compare.Caddyfile \
		>"$work/caddy-$1.log" 2>&1 &
	caddy_pid=$!
	for s in plain locked idem; do
		wait_port "${port[$s]}" caddy || {
			cat "$work/caddy-$1.log" >&2
			exit 1
		}
	done
}
stop_caddy() {
	kill "$caddy_pid"
	wait "$caddy_pid" 2>/dev/null || true
}

for r in $(seq "$rounds"); do
	builds=(this rev) sites=(plain locked)
	if ((r % 2 == 0)); then builds=(rev this) sites=(locked plain); fi
	for b in "${builds[@]}"; do
		start_caddy "$b"
		for s in plain locked; do wrk_rps "http://127.0.0.1:${port[$s]}/" "$warmup" >/dev/null; done
		for s in "${sites[@]}"; do
			rps=$(wrk_rps "http://127.0.0.1:${port[$s]}/" "$duration")
			printf 'round %d  %-4s %-6s %9.1f req/s\n' "$r" "$b" "$s" "$rps"
			echo "$r $b $s $rps" >>"$results"
		done
		stop_caddy
	done
done

((rounds > 0)) && echo "== summary: medians over $rounds rounds; this tree against $rev" &&
awk '
	{ rps[$1, $2, $3] = $4; n = ($1 > n) ? $1 : n }
	function median(a, k,   i, j, t) {
		for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
		return (k % 2) ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
	}
	function show(label, num_b, num_s, den_b, den_s,   r, v) {
		for (r = 1; r <= n; r++) v[r] = (den_b == "") ? rps[r, num_b, num_s] : rps[r, num_b, num_s] / rps[r, den_b, den_s]
		printf (den_b == "") ? "%-34s %9.1f\n" : "%-34s %9.3f\n", label, median(v, n)
	}
	END {
		show("req/s, this tree, plain", "this", "plain")
		show("req/s, this tree, locked", "this", "locked")
		show("req/s, " REV ", plain", "rev", "plain")
		show("req/s, " REV ", locked", "rev", "locked")
		show("locked/plain, this tree", "this", "locked", "this", "plain")
		show("locked/plain, " REV, "rev", "locked", "rev", "plain")
		show("locked, this tree / " REV, "this", "locked", "rev", "locked")
		show("plain, this tree / " REV, "this", "plain", "rev", "plain")
	}' REV="$rev" "$results"

latency_rates=${LOADTEST_LATENCY_RATES-500}
[ -n "$latency_rates" ] || exit 0
latency_rounds=${LOADTEST_LATENCY_ROUNDS:-3}
echo
echo "== latency at a constant rate (rates $latency_rates), $latency_rounds rounds, one Caddy at a time"
lat=$work/latency.results
for r in $(seq "$latency_rounds"); do
	builds=(this rev)
	if ((r % 2 == 0)); then builds=(rev this); fi
	for b in "${builds[@]}"; do
		start_caddy "$b"
		# One request per site first: connections and scripts.
		for s in plain locked idem; do wrk_rps "http://127.0.0.1:${port[$s]}/" 1s >/dev/null; done
		# The tool's summary lines: route, p50, p90, p99 (ms), ratios.
		"$work/latency" -plain "http://127.0.0.1:${port[plain]}/" -locked "http://127.0.0.1:${port[locked]}/" \
			-idem "http://127.0.0.1:${port[idem]}/" -rates "$latency_rates" \
			-duration "${LOADTEST_LATENCY_DURATION:-10s}" -rounds 1 >"$work/latency.out"
		awk -v r="$r" -v b="$b" '
			/^== [0-9]+ req\/s/ {rate = $2}
			rate && /^(plain|lock|idempotency) / {print r, b, rate, $1, $2, $4, $5, $7}' "$work/latency.out" | tee -a "$lat" |
			awk '{printf "round %d  %-4s %4s/s %-12s p50 %6.3f ms  p99 %6.3f ms\n", $1, $2, $3, $4, $5, $6}'
		stop_caddy
	done
done
echo "== latency summary: medians over $latency_rounds rounds (p50 and p99 in ms, and their ratio to plain in the same run)"
awk '
	{ k = $3 SUBSEP $2 SUBSEP $4; n[k]++; p50[k, n[k]] = $5; p99[k, n[k]] = $6; r50[k, n[k]] = $7; r99[k, n[k]] = $8
	  if (!($3 in seen)) { seen[$3] = 1; rates[++nr] = $3 } }
	function med(a, k, m,   i, j, t, v) {
		for (i = 1; i <= m; i++) v[i] = a[k, i] + 0
		for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
		return (m % 2) ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2
	}
	END {
		printf "%-6s %-5s %-12s %8s %8s %10s %10s\n", "rate", "build", "route", "p50", "p99", "p50/plain", "p99/plain"
		split("plain lock idempotency", routes, " ")
		for (i = 1; i <= nr; i++) for (bi = 1; bi <= 2; bi++) for (j = 1; j <= 3; j++) {
			b = (bi == 1) ? "this" : "rev"; k = rates[i] SUBSEP b SUBSEP routes[j]
			if (!n[k]) continue
			printf "%-6s %-5s %-12s %8.3f %8.3f %10.2f %10.2f\n", rates[i] "/s", (b == "this" ? "this" : REV), routes[j],
				med(p50, k, n[k]), med(p99, k, n[k]), med(r50, k, n[k]), med(r99, k, n[k])
		}
	}' REV="$rev" "$lat"
