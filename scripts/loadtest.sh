#!/usr/bin/env bash
# Load test: requests per second through Caddy to the same fast upstream (a
# small JSON answer), every request a POST of a small JSON charge
# (scripts/loadtest/keys.lua), in five modes, with the same method for each:
#
#   plain   reverse_proxy
#   floor   the floor of any Redis lock in front of reverse_proxy: SET NX PX
#           before it and a compare-and-delete script after it, through the
#           same go-redis autopipeliner, and nothing else (internal/floor),
#           a distinct Idempotency-Key per request
#   locked  redis_lock + reverse_proxy, a distinct Idempotency-Key per request
#   idem    redis_lock in idempotency mode + reverse_proxy, a distinct key per
#           request: every answer is stored
#   replay  the idempotency site, every request a retry of a key whose answer
#           is already stored (LOADTEST_REPLAY_KEYS keys are stored first;
#           wrk then cycles through them): every answer comes from Redis
#
# One Caddy (tools/loadcaddy: the plugin and the floor handler) serves the four
# sites. A round runs the five modes back to back, in alternating order; the
# verdicts are medians of per-round ratios: locked against plain, idem
# against locked, replay against plain. Floor against plain, and locked
# against floor, tell how much of locked's cost any lock would have. Everything
# listens on 127.0.0.1 and is stopped on exit.
#
#   LOADTEST_ROUNDS         rounds, each one run of every mode (default 5)
#   LOADTEST_DURATION       length of one run (default 10s)
#   LOADTEST_WARMUP         warm-up per mode before the runs (default 3s)
#   LOADTEST_CONNECTIONS    wrk connections (default 64)
#   LOADTEST_THREADS        wrk threads (default: number of CPUs)
#   LOADTEST_CADDY          a prebuilt Caddy with the plugin and the floor handler
#                           (default: go build ./loadcaddy in tools/)
#   LOADTEST_CADDYFILE      Caddyfile (default scripts/loadtest/Caddyfile)
#   LOADTEST_BODY_SIZE      bytes of the upstream's JSON answer (default 100;
#                           it is never smaller than 108)
#   LOADTEST_REPLAY_KEYS    keys stored before the replay runs (default 4096)
#   LOADTEST_TARGET         ratio target, locked/plain (default 0.85)
#   LOADTEST_IDEM_TARGET    ratio target, idem/locked (default 0.90)
#   LOADTEST_REPLAY_TARGET  ratio target, replay/plain (default 2.00)
#   LOADTEST_MAX_STEAL      a round whose runs lost more than this % of the CPU
#                           to the VM's host (steal) is run again, up to 3x
#                           rounds in all (default 5)
#   LOADTEST_STRICT=1       exit non-zero when a ratio is below its target
#   LOADTEST_LATENCY_RATES  constant request rates of the latency runs
#                           (default 100,500; "" skips them)
#   LOADTEST_LATENCY_DURATION, LOADTEST_LATENCY_ROUNDS
#                           length of one latency run (default 10s) and
#                           rounds (default 3)
#
# After the throughput rounds, bench/latency runs an open-loop load at each
# constant rate against the plain, floor, locked and idem sites (vegeta), and
# prints p50, p90 and p99 with their ratios to plain in the same round, and
# what each site adds to the floor's p50.
#
# Exits non-zero when a floor, locked, idem or replay run answered anything but 2xx
# or had socket errors (with a distinct key per request nothing may
# conflict), when a replay run ran a request instead of replaying it, and
# when a lock key is left in Redis.
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=${LOADTEST_ROUNDS:-5}
duration=${LOADTEST_DURATION:-10s}
warmup=${LOADTEST_WARMUP:-3s}
conns=${LOADTEST_CONNECTIONS:-64}
threads=${LOADTEST_THREADS:-$(nproc)}
target=${LOADTEST_TARGET:-0.85}
idem_target=${LOADTEST_IDEM_TARGET:-0.90}
replay_target=${LOADTEST_REPLAY_TARGET:-2.00}
max_steal=${LOADTEST_MAX_STEAL:-5}
caddyfile=${LOADTEST_CADDYFILE:-scripts/loadtest/Caddyfile}
body_size=${LOADTEST_BODY_SIZE:-100}
replay_keys=${LOADTEST_REPLAY_KEYS:-4096}

for tool in redis-server redis-cli wrk go; do
	command -v "$tool" >/dev/null && continue
	if [ "$tool" = wrk ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		echo "installing wrk with apt-get"
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null
	else
		echo "$tool not found (redis-server, redis-cli: make redis; wrk: apt-get install -y wrk)" >&2
		exit 1
	fi
done

# Each wrk thread cycles through keys of its own (scripts/loadtest/keys.lua).
replay_cycle=$((replay_keys / threads))
if ((replay_cycle < 4 * conns / threads)); then
	echo "LOADTEST_REPLAY_KEYS=$replay_keys is too few for $conns connections: a key would come back while its request runs" >&2
	exit 1
fi
replay_keys=$((replay_cycle * threads))

work=$(mktemp -d)
pids=()
cleanup() {
	local pid
	for pid in "${pids[@]}"; do
		kill "$pid" 2>/dev/null || true
	done
	for pid in "${pids[@]}"; do
		wait "$pid" 2>/dev/null || true
	done
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

source scripts/loadtest/ports.sh

echo "building caddy and the upstream"
caddy=${LOADTEST_CADDY:-}
if [ -z "$caddy" ]; then
	caddy=$work/caddy
	(cd tools && go build -o "$caddy" ./loadcaddy)
fi
(cd tools && go build -o "$work/upstream" ./loadupstream)

redis_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
	--daemonize no --loglevel warning --dir "$work" >"$work/redis.log" 2>&1 &
redis_pid=$!
pids+=($!)
wait_port "$redis_port" redis-server
rcli() { redis-cli -p "$redis_port" "$@"; }

"$work/upstream" -addr 127.0.0.1:0 -size "$body_size" >"$work/upstream.out" 2>&1 &
upstream_pid=$!
pids+=($!)
for _ in $(seq 150); do
	[ -s "$work/upstream.out" ] && break
	sleep 0.1
done
upstream=$(head -n1 "$work/upstream.out")

plain_port=$(free_port)
locked_port=$(free_port)
idem_port=$(free_port)
floor_port=$(free_port)
while [ "$locked_port" = "$plain_port" ]; do locked_port=$(free_port); done
while [ "$idem_port" = "$plain_port" ] || [ "$idem_port" = "$locked_port" ]; do idem_port=$(free_port); done
while [[ " $plain_port $locked_port $idem_port " == *" $floor_port "* ]]; do floor_port=$(free_port); done
LT_PLAIN_PORT=$plain_port LT_LOCKED_PORT=$locked_port LT_IDEM_PORT=$idem_port LT_FLOOR_PORT=$floor_port \
	LT_UPSTREAM=$upstream LT_REDIS=127.0.0.1:$redis_port \
	"$caddy" run --adapter caddyfile --config "$caddyfile" >"$work/caddy.log" 2>&1 &
caddy_pid=$!
pids+=($!)
for port in "$plain_port" "$locked_port" "$idem_port" "$floor_port"; do
	if ! wait_port "$port" caddy; then
		cat "$work/caddy.log" >&2
		exit 1
	fi
done

declare -A url=(
	[plain]=http://127.0.0.1:$plain_port/
	[floor]=http://127.0.0.1:$floor_port/
	[locked]=http://127.0.0.1:$locked_port/
	[idem]=http://127.0.0.1:$idem_port/
	[replay]=http://127.0.0.1:$idem_port/
)
# probe PORT: the status code of one GET / with an Idempotency-Key (bash
# /dev/tcp, so curl is not needed).
probe() {
	local line=""
	exec 3<>/dev/tcp/127.0.0.1/"$1"
	printf 'GET / HTTP/1.0\r\nHost: 127.0.0.1\r\nIdempotency-Key: lt-probe-%s\r\n\r\n' "$RANDOM$RANDOM" >&3
	read -r -t 10 line <&3 || true
	exec 3<&-
	awk '{print $2}' <<<"$line"
}
# content_length HOST:PORT: the Content-Length of the answer to GET /.
content_length() {
	local line n=""
	exec 3<>/dev/tcp/"${1%:*}"/"${1##*:}"
	printf 'GET / HTTP/1.0\r\nHost: %s\r\n\r\n' "$1" >&3
	while read -r -t 10 line <&3; do
		line=${line%$'\r'}
		[ -z "$line" ] && break
		if [[ ${line,,} == content-length:* ]]; then n=${line#*: }; fi
	done
	exec 3<&-
	echo "${n:-?}"
}
answer_bytes=$(content_length "$upstream")
# One request each, so a broken setup fails here and not after a minute.
for port in "$plain_port" "$locked_port" "$idem_port" "$floor_port"; do
	code=$(probe "$port")
	if [ "$code" != 200 ]; then
		echo "probe of 127.0.0.1:$port answered '${code}'" >&2
		cat "$work/caddy.log" >&2
		exit 1
	fi
done

echo "caddy $("$caddy" version | awk '{print $1}'), redis $(redis-server --version | awk '{print $3}'), wrk $(wrk --version 2>&1 | head -n1 | awk '{print $2}'), $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "wrk -t$threads -c$conns -d$duration; the upstream answers ${answer_bytes} bytes of JSON"
echo "$rounds rounds of a plain, a floor, a locked, an idem (distinct keys) and a replay ($replay_keys stored keys) run, order alternating"

# cpu_ticks PID: user+system CPU time of a process, in clock ticks.
cpu_ticks() { awk '{sub(/.*\) /, ""); print $12 + $13}' "/proc/$1/stat" 2>/dev/null || echo 0; }
hz=$(getconf CLK_TCK 2>/dev/null || echo 100)
# cpu_stat: the machine's idle, steal and total clock ticks (/proc/stat), to
# tell an idle machine (latency-bound) from one whose host took the time.
cpu_stat() { awk '/^cpu / {t = 0; for (i = 2; i <= NF; i++) t += $i; print $5 + $6, $9, t}' /proc/stat; }

nonce=$(date +%s)
bad=0
rps=0
cpu=""
cpu_caddy=0 cpu_redis=0 cpu_upstream=0
steal=0
# run KIND DURATION [prestore]: one wrk run of a mode; sets rps, cpu (CPU
# time per request of Caddy, Redis and the upstream, which moves less than
# req/s when the machine is shared, as text) and cpu_caddy, cpu_redis,
# cpu_upstream (µs per request); flags errors of all but plain runs; writes
# Redis's INFO commandstats of the run to $work/run.stats. A replay run
# checks that no request ran, but for the one that stores the keys (prestore).
run() {
	local kind=$1 d=$2 out non2xx sockerr c0 r0 u0 n ran s0 s1 args
	nonce=$((nonce + 1))
	if [ "$kind" = replay ]; then
		args=(replay "$replay_cycle")
	else
		args=("$nonce-$kind")
	fi
	rcli config resetstat >/dev/null
	c0=$(cpu_ticks "$caddy_pid") r0=$(cpu_ticks "$redis_pid") u0=$(cpu_ticks "$upstream_pid")
	s0=$(cpu_stat)
	out=$(wrk -t"$threads" -c"$conns" -d"$d" -s scripts/loadtest/keys.lua "${url[$kind]}" -- "${args[@]}")
	s1=$(cpu_stat)
	read -r cpu_caddy cpu_redis cpu_upstream < <(awk -v n="$(awk '/requests in/ {print $1}' <<<"$out")" -v hz="$hz" \
		-v c="$(($(cpu_ticks "$caddy_pid") - c0))" -v r="$(($(cpu_ticks "$redis_pid") - r0))" \
		-v u="$(($(cpu_ticks "$upstream_pid") - u0))" \
		'BEGIN {n += 0; if (n > 0) printf "%.1f %.1f %.1f\n", c*1e6/hz/n, r*1e6/hz/n, u*1e6/hz/n; else print "0 0 0"}')
	n=$(awk '/requests in/ {print $1}' <<<"$out")
	rcli info commandstats | tr -d '\r' | awk -F'[:,=]' -v kind="$kind" -v n="${n:-0}" '
		BEGIN {print "R", kind, n}
		/^cmdstat_/ {cmd = substr($1, 9); if (cmd != "info" && cmd !~ /^config/) print "C", kind, cmd, $3, $5}' >"$work/run.stats"
	rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
	rps=${rps:-0}
	cpu=$(printf 'CPU/req: caddy %4.0fµs  redis %3.0fµs  upstream %3.0fµs' "$cpu_caddy" "$cpu_redis" "$cpu_upstream")
	cpu+=$(awk -v a="$s0" -v b="$s1" 'BEGIN {split(a, x, " "); split(b, y, " "); t = y[3] - x[3]
		if (t > 0) printf "  idle %2.0f%%  steal %2.0f%%", 100 * (y[1] - x[1]) / t, 100 * (y[2] - x[2]) / t}')
	steal=$(awk -v a="$s0" -v b="$s1" 'BEGIN {split(a, x, " "); split(b, y, " "); t = y[3] - x[3]
		print (t > 0) ? int(100 * (y[2] - x[2]) / t) : 0}')
	non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $NF}' <<<"$out")
	sockerr=$(grep -o 'Socket errors:.*' <<<"$out" || true)
	if [ -n "$non2xx" ] || [ -n "$sockerr" ]; then
		echo "  $kind: non-2xx ${non2xx:-0}; ${sockerr:-no socket errors}" >&2
		if [ "$kind" != plain ]; then bad=1; fi
	fi
	# A request that ran took a lock: HSET in the begin script, which a
	# replay does not run.
	ran=$(awk '$1 == "C" && $3 == "hset" {n += $4} END {print n + 0}' "$work/run.stats")
	if [ "$kind" = replay ] && [ "${3:-}" != prestore ] && [ "$ran" -gt 0 ]; then
		echo "  replay: $ran requests ran instead of being replayed" >&2
		bad=1
	fi
}

for kind in plain floor locked idem; do
	run "$kind" "$warmup"
done

# Store the replay keys' answers: a replay run from no records, as long as
# a warm-up (the first pass through the keys runs and stores them, the rest
# replays); until every key has its record. Redis memory before and after
# gives the memory per stored answer.
records() { rcli --scan --pattern 'redis_lock:{*}*:result' | wc -l; }
used_memory() { rcli info memory | tr -d '\r' | awk -F: '$1 == "used_memory" {print $2}'; }
rec0=$(records)
mem0=$(used_memory)
for try in 1 2 3; do
	run replay "$warmup" prestore
	rec1=$(records)
	((rec1 - rec0 >= replay_keys)) && break
	echo "stored $((rec1 - rec0)) of $replay_keys replay keys after $try warm-up runs" >&2
done
if ((rec1 - rec0 != replay_keys)); then
	echo "FAIL: $((rec1 - rec0)) records stored for $replay_keys replay keys" >&2
	exit 1
fi
mem1=$(used_memory)
record_key=""
for _ in $(seq 20); do
	record_key=$(rcli randomkey)
	[[ $record_key == *:result ]] && break
done
record_bytes=$(rcli strlen "$record_key")
record_usage=$(rcli memory usage "$record_key")
bad=0 # warm-up errors (first connections) do not count

modes=(plain floor locked idem replay)
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", (b > 0) ? a / b : 0}'; }
declare -A rps_of cpu_caddy_of cpu_redis_of cpu_upstream_of cpu_total_of round_rps round_caddy round_redis round_upstream
ratios_lp=()
ratios_il=()
ratios_rp=()
ratios_fp=()
ratios_lf=()
: >"$work/all.stats"
# Each round runs every mode back to back, in alternating order (replay
# plain floor locked idem, then idem locked floor plain replay, ...), so that each pair
# compared runs side by side and a machine that speeds up or slows down
# during the test weighs on every mode alike. The verdicts are medians of the
# per-round ratios: each run against its neighbour of the same round.
i=0
tries=0
while ((i < rounds)); do
	i=$((i + 1))
	tries=$((tries + 1))
	if ((i % 2)); then order="replay plain floor locked idem"; else order="idem locked floor plain replay"; fi
	stolen=0
	: >"$work/round.stats"
	for kind in $order; do
		run "$kind" "$duration"
		cat "$work/run.stats" >>"$work/round.stats"
		round_rps[$kind]=$rps
		round_caddy[$kind]=$cpu_caddy
		round_redis[$kind]=$cpu_redis
		round_upstream[$kind]=$cpu_upstream
		((steal > max_steal)) && stolen=1
		printf 'round %d  %-6s  %10.1f req/s   %s\n' "$i" "$kind" "$rps" "$cpu"
	done
	# A round in which the VM's host took the CPU (steal) measures the
	# neighbours, not this code: it is shown, then run again.
	if ((stolen && tries < 3 * rounds)); then
		echo "round $i: steal above $max_steal%, not counted; running it again"
		i=$((i - 1))
		continue
	fi
	cat "$work/round.stats" >>"$work/all.stats"
	for kind in "${modes[@]}"; do
		rps_of[$kind]+=" ${round_rps[$kind]}"
		cpu_caddy_of[$kind]+=" ${round_caddy[$kind]}"
		cpu_redis_of[$kind]+=" ${round_redis[$kind]}"
		cpu_upstream_of[$kind]+=" ${round_upstream[$kind]}"
		cpu_total_of[$kind]+=" $(awk -v a="${round_caddy[$kind]}" -v b="${round_redis[$kind]}" -v c="${round_upstream[$kind]}" 'BEGIN {print a + b + c}')"
	done
	ratios_lp+=("$(ratio "${round_rps[locked]}" "${round_rps[plain]}")")
	ratios_il+=("$(ratio "${round_rps[idem]}" "${round_rps[locked]}")")
	ratios_rp+=("$(ratio "${round_rps[replay]}" "${round_rps[plain]}")")
	ratios_fp+=("$(ratio "${round_rps[floor]}" "${round_rps[plain]}")")
	ratios_lf+=("$(ratio "${round_rps[locked]}" "${round_rps[floor]}")")
done

median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
verdict() { awk -v r="$1" -v t="$2" 'BEGIN {print (r >= t) ? "meets" : "below"}'; }
r_lp=$(median "${ratios_lp[@]}")
r_il=$(median "${ratios_il[@]}")
r_rp=$(median "${ratios_rp[@]}")
r_fp=$(median "${ratios_fp[@]}")
r_lf=$(median "${ratios_lf[@]}")
v_lp=$(verdict "$r_lp" "$target")
v_il=$(verdict "$r_il" "$idem_target")
v_rp=$(verdict "$r_rp" "$replay_target")

# Lock keys left behind: redis_lock:{<4 hex>}<64 hex>, not the counters
# ({<4 hex>}fence) nor the records (...:result). A running idempotent
# request's fingerprint lives in its lock, so this counts those too.
lockglob="redis_lock:{????}$(printf '?%.0s' $(seq 64))"
keys=$(($(rcli --scan --pattern "$lockglob" | wc -l) + $(rcli --scan --pattern 'redis_lock_floor:*' | wc -l)))

echo
echo "== summary: medians of $i counted rounds ($tries run), wrk -t$threads -c$conns -d$duration, ${answer_bytes}-byte JSON answers"
printf '%-8s %12s   %s\n' mode "req/s" "CPU µs/req: caddy   redis upstream  all three"
for kind in "${modes[@]}"; do
	# shellcheck disable=SC2086 # the lists are space-separated numbers
	printf '%-8s %12.1f   %17.0f %7.0f %8.0f %10.0f\n' "$kind" "$(median ${rps_of[$kind]})" \
		"$(median ${cpu_caddy_of[$kind]})" "$(median ${cpu_redis_of[$kind]})" "$(median ${cpu_upstream_of[$kind]})" \
		"$(median ${cpu_total_of[$kind]})"
done
echo "ratios per round, locked/plain:  ${ratios_lp[*]}"
echo "ratios per round, idem/locked:   ${ratios_il[*]}"
echo "ratios per round, replay/plain:  ${ratios_rp[*]}"
echo "ratios per round, floor/plain:   ${ratios_fp[*]}"
echo "ratios per round, locked/floor:  ${ratios_lf[*]}"
printf 'ratio locked/plain   %s  (%s the target %s)\n' "$r_lp" "$v_lp" "$target"
printf 'ratio idem/locked    %s  (%s the target %s)\n' "$r_il" "$v_il" "$idem_target"
printf 'ratio replay/plain   %s  (%s the target %s)\n' "$r_rp" "$v_rp" "$replay_target"
printf 'ratio floor/plain    %s  (the floor: a bare lock, two round trips and nothing else)\n' "$r_fp"
printf 'ratio locked/floor   %s  (what redis_lock costs beyond the floor)\n' "$r_lf"
echo "Redis INFO commandstats per request, counted rounds (calls/req x µs/call; a"
echo "script's µs include the commands it runs, which are listed on their own too):"
awk '
	$1 == "R" {n[$2] += $3}
	$1 == "C" {calls[$2, $3] += $4; usec[$2, $3] += $5; if (!seen[$2, $3]++) cmds[$2] = cmds[$2] " " $3}
	END {
		split("floor locked idem replay", order, " ")
		for (o = 1; o <= 4; o++) {
			k = order[o]
			if (!n[k]) continue
			m = split(cmds[k], c, " ")
			# by µs per request, largest first
			for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++)
				if (usec[k, c[j]] > usec[k, c[i]]) { t = c[i]; c[i] = c[j]; c[j] = t }
			line = ""
			for (i = 1; i <= m && i <= 7; i++)
				line = line sprintf("%s%s %.2f x %.1f", (i > 1 ? ", " : ""), c[i], calls[k, c[i]] / n[k], usec[k, c[i]] / calls[k, c[i]])
			printf "  %-7s %s\n", k, line
		}
	}' "$work/all.stats"
echo "Redis memory per stored answer (${answer_bytes}-byte JSON and its headers as Caddy stores them, $replay_keys records):"
echo "  used_memory $(((mem1 - mem0) / replay_keys)) bytes/record; one record: value $record_bytes bytes, MEMORY USAGE $record_usage bytes"
echo "Redis after the test: $keys lock keys left, $(rcli dbsize) keys (records and fencing counters)"

latency_rates=${LOADTEST_LATENCY_RATES-100,500}
if [ -n "$latency_rates" ]; then
	echo
	echo "== latency at a constant rate (open loop, a new Idempotency-Key per request)"
	(cd bench && go run ./latency -plain "${url[plain]}" -floor "${url[floor]}" -locked "${url[locked]}" -idem "${url[idem]}" \
		-rates "$latency_rates" -duration "${LOADTEST_LATENCY_DURATION:-10s}" -rounds "${LOADTEST_LATENCY_ROUNDS:-3}") || bad=1
fi

if [ "$bad" != 0 ]; then
	echo "FAIL: floor, locked, idem or replay runs answered non-2xx, had socket errors, or ran instead of replaying" >&2
	exit 1
fi
if [ "$keys" != 0 ]; then
	echo "FAIL: $keys lock keys left in Redis after the runs" >&2
	exit 1
fi
if [ "${LOADTEST_STRICT:-}" = 1 ] && [[ "$v_lp $v_il $v_rp" == *below* ]]; then
	exit 1
fi
