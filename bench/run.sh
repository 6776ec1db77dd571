#!/usr/bin/env bash
# Lock library benchmarks: this library beside bsm/redislock, redsync,
# rueidislock and a raw floor, all against one redis-server that the
# benchmark binary starts itself. Prints a benchstat table by library and the
# project's targets for the parallel-distinct-keys shape.
#
# Then what each guarantee of the acquire script costs Redis
# (BenchmarkAcquireScript: the shipped script beside variants with one
# guarantee taken out, in pipelines).
#
# Then the idempotency mode's Redis side (package record, a 1 KiB answer):
# a request that runs (Begin+Complete) and a replay (Begin of a completed
# key) beside a lock cycle, as a benchstat table by operation; Redis memory
# per stored 1 KiB answer (TestRecordMemory, once); and the round trips per
# request that record's TestRoundTripsPerRequest checks (in the main module).
#
#   BENCH_COUNT  rounds (default 6)           BENCH_TIME  -benchtime (default 1s)
#   BENCH        -bench regexp (default .)
#
# The rounds are interleaved (round 1 of every benchmark, then round 2, ...)
# rather than `-count N` back to back, so a burst of load on a shared machine
# lands on every library alike instead of on one of them.
set -euo pipefail
cd "$(dirname "$0")"

count=${BENCH_COUNT:-6}
benchtime=${BENCH_TIME:-1s}
bench=${BENCH:-.}
benchstat=golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da

command -v redis-server >/dev/null || { echo "redis-server not found: run 'make bench', which installs it" >&2; exit 1; }

mkdir -p results
out=results/bench-$(date -u +%Y%m%dT%H%M%SZ).txt
bin=results/bench.test
go test -c -o "$bin" .
{
	echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $(uname -srm), $(nproc) CPUs, $(redis-server --version | awk '{print $3}'), $(go version | awk '{print $3}')"
	echo "# BENCH=$bench BENCH_COUNT=$count BENCH_TIME=$benchtime"
} >"$out"
for i in $(seq "$count"); do
	echo "round $i/$count" >&2
	"./$bin" -test.run '^$' -test.bench "$bench" -test.benchmem -test.count 1 -test.benchtime "$benchtime" >>"$out"
done
echo "Redis memory per stored answer (TestRecordMemory)" >&2
mem=$("./$bin" -test.run '^TestRecordMemory$' -test.v -test.count 1 | grep -o 'record-memory: .*') ||
	echo "TestRecordMemory failed: no memory figures" >&2
awk '{print "# " $0}' <<<"$mem" >>"$out"
rm -f "$bin"
echo "raw output: bench/$out"
echo

go run "$benchstat" -filter '-.name:Idempotency AND -.name:AcquireScript' -col /lib "$out"

# Targets, parallel distinct keys, from the medians: reqlock ns/op <= bsm's
# and <= 1.10x raw's; Redis CPU per cycle <= 1.2x raw's; allocs/op below
# bsm's.
awk '
	/^BenchmarkParallelDistinct\/lib=/ {
		split($1, a, "="); lib = a[2]; sub(/-[0-9]+$/, "", lib)
		for (i = 3; i < NF; i++) {
			if ($(i+1) == "ns/op") ns[lib, ++nn[lib]] = $i
			if ($(i+1) == "redis-cpu-ns/op") rc[lib, ++nr[lib]] = $i
			if ($(i+1) == "allocs/op") al[lib, ++na[lib]] = $i
		}
	}
	function median(arr, lib, n,    i, j, t, v) {
		for (i = 1; i <= n; i++) v[i] = arr[lib, i] + 0
		for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
		return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
	}
	END {
		if (!nn["reqlock"] || !nn["bsm"] || !nn["raw"]) exit
		r = median(ns, "reqlock", nn["reqlock"]); b = median(ns, "bsm", nn["bsm"]); w = median(ns, "raw", nn["raw"])
		ra = median(al, "reqlock", na["reqlock"]); ba = median(al, "bsm", na["bsm"])
		rr = median(rc, "reqlock", nr["reqlock"]); wr = median(rc, "raw", nr["raw"])
		print ""
		print "Targets, ParallelDistinct (medians):"
		printf "  reqlock/bsm ns/op    %.3f  (target <= 1.00)  %s\n", r / b, (r <= b ? "met" : "MISSED")
		printf "  reqlock/raw ns/op    %.3f  (target <= 1.10)  %s\n", r / w, (r <= 1.10 * w ? "met" : "MISSED")
		if (wr > 0) printf "  reqlock/raw Redis CPU %.3f  (target <= 1.20)  %s\n", rr / wr, (rr <= 1.20 * wr ? "met" : "MISSED")
		printf "  allocs/op reqlock %d, bsm %d  (target: fewer)  %s\n", ra, ba, (ra < ba ? "met" : "MISSED")
	}
' "$out"

# The acquire script's guarantees, each taken out in turn: Redis CPU per
# acquire+release, medians, beside the native SET NX PX floor.
awk '
	/^BenchmarkAcquireScript\// {
		split($1, a, "/"); v = a[2]; sub(/-[0-9]+$/, "", v)
		if (!(v in seen)) { seen[v] = 1; order[++n] = v }
		for (i = 3; i < NF; i++) if ($(i+1) == "redis-cpu-ns/op") c[v, ++m[v]] = $i
	}
	function med(v,   i, j, t, k, w) {
		k = m[v]; for (i = 1; i <= k; i++) w[i] = c[v, i] + 0
		for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (w[j] < w[i]) { t = w[i]; w[i] = w[j]; w[j] = t }
		return k % 2 ? w[(k + 1) / 2] : (w[k / 2] + w[k / 2 + 1]) / 2
	}
	END {
		if (!n || !m["shipped"] || !m["set-nx-px"]) exit
		s = med("shipped"); f = med("set-nx-px")
		print ""
		print "The acquire script, Redis CPU per acquire+release in pipelines of 32 (BenchmarkAcquireScript, medians):"
		printf "  %-14s %8s %10s %12s\n", "variant", "µs", "vs shipped", "/ set-nx-px"
		for (o = 1; o <= n; o++) { v = order[o]; x = med(v)
			printf "  %-14s %8.2f %+10.2f %12.2f\n", v, x / 1e3, (x - s) / 1e3, x / f }
	}
' "$out"

# The idempotency mode: a request that runs (execute) and a replay, beside a
# lock cycle of a new key (lock), by shape.
echo
go run "$benchstat" -filter '.name:Idempotency' -col /op -row /shape "$out"
awk '
	/^BenchmarkIdempotency\/shape=/ {
		split($1, a, "/"); shape = substr(a[2], 7); op = substr(a[3], 4); sub(/-[0-9]+$/, "", op)
		if (!(shape in seen)) { seen[shape] = 1; shapes[++ns] = shape }
		for (i = 3; i < NF; i++) {
			u = $(i+1)
			if (u == "ns/op" || u == "redis-cpu-ns/op" || u == "client-cpu-ns/op" || u == "allocs/op") v[shape, op, u, ++n[shape, op, u]] = $i
		}
	}
	function med(shape, op, u,    i, j, t, m, w) {
		m = n[shape, op, u]
		if (!m) return 0
		for (i = 1; i <= m; i++) w[i] = v[shape, op, u, i] + 0
		for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (w[j] < w[i]) { t = w[i]; w[i] = w[j]; w[j] = t }
		return m % 2 ? w[(m + 1) / 2] : (w[m / 2] + w[m / 2 + 1]) / 2
	}
	END {
		if (!ns) exit
		print ""
		print "Idempotency, medians (µs per op; execute = Begin+Complete of a new key, replay = Begin of a completed one):"
		printf "  %-22s %8s %8s %8s %14s %18s %18s %14s\n", "shape", "lock", "execute", "replay", "execute/lock", "redis CPU l/e/r", "client CPU l/e/r", "allocs l/e/r"
		for (s = 1; s <= ns; s++) {
			sh = shapes[s]
			l = med(sh, "lock", "ns/op"); e = med(sh, "execute", "ns/op"); r = med(sh, "replay", "ns/op")
			printf "  %-22s %8.1f %8.1f %8.1f %14.2f %6.1f/%5.1f/%5.1f %6.1f/%5.1f/%5.1f %4d/%4d/%4d\n", sh, l / 1e3, e / 1e3, r / 1e3, (l > 0 ? e / l : 0),
				med(sh, "lock", "redis-cpu-ns/op") / 1e3, med(sh, "execute", "redis-cpu-ns/op") / 1e3, med(sh, "replay", "redis-cpu-ns/op") / 1e3,
				med(sh, "lock", "client-cpu-ns/op") / 1e3, med(sh, "execute", "client-cpu-ns/op") / 1e3, med(sh, "replay", "client-cpu-ns/op") / 1e3,
				med(sh, "lock", "allocs/op"), med(sh, "execute", "allocs/op"), med(sh, "replay", "allocs/op")
		}
	}
' "$out"
if [ -n "$mem" ]; then
	echo
	echo "Redis memory per stored 1 KiB answer (TestRecordMemory):"
	awk '{sub(/^record-memory: /, "  "); print}' <<<"$mem"
fi

# Round trips per request, as record's TestRoundTripsPerRequest checks them
# (make test runs it too).
echo
echo "Round trips per request (record.TestRoundTripsPerRequest, client=plain):"
(cd .. && go test -count=1 -run '^TestRoundTripsPerRequest$/^client=plain$' -v ./record/) |
	sed -n 's/^ *roundtrips_test.go:[0-9]*: /  /p'

# A waiter woken by the release, through Caddy: from the holder's answer to
# the waiter's, over 200 waits (BenchmarkWakeAfterRelease).
echo
echo "Waiter's answer after the holder's, 200 waits through Caddy (BenchmarkWakeAfterRelease):"
(cd .. && go test -count=1 -run '^$' -bench '^BenchmarkWakeAfterRelease$' -benchtime=200x . 2>/dev/null) |
	awk '
	# Caddy logs on stdout between a benchmark name and its figures.
	$1 ~ /^BenchmarkWakeAfterRelease\// { split($1, a, "[/-]"); cur = a[2] }
	/ns\/op/ && cur != "" { sub(/.* ns\/op */, ""); print "  " cur ": " $0; cur = "" }'

# The handler's own cost per request, without Caddy's server, an upstream or
# a network client (BenchmarkHandler): CPU time and allocations move far less
# than req/s through Caddy.
echo
echo "The handler alone, per request (BenchmarkHandler, ${BENCH_COUNT:-6} rounds; none is the harness without the handler, floor the load test's bare lock):"
(cd .. && go test -count="${BENCH_COUNT:-6}" -run '^$' -bench '^BenchmarkHandler$' -benchtime="${BENCH_TIME:-1s}" . 2>/dev/null) |
	awk '
	# Caddy logs the handler provisioning on stdout between a benchmark name
	# and its figures: take the name from its line, the figures from the
	# next line that has them.
	$1 ~ /^BenchmarkHandler\// { split($1, a, "[/-]"); cur = a[2]; if (!(cur in order)) { order[cur] = ++n; name[n] = cur } }
	/ns\/op/ && cur != "" {
		for (i = 1; i < NF; i++) if ($(i + 1) ~ /\/op$/) v[cur, $(i + 1)] = v[cur, $(i + 1)] " " $i
		cur = ""
	}
	function med(s,   x, k, i, j, t) { k = split(s, x, " "); for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (x[j] + 0 < x[i] + 0) { t = x[i]; x[i] = x[j]; x[j] = t }
		return (k % 2) ? x[(k + 1) / 2] : (x[k / 2] + x[k / 2 + 1]) / 2 }
	END {
		printf "  %-12s %10s %12s %16s %8s %10s\n", "mode", "ns/op", "cpu-ns/op", "redis-cpu-ns/op", "B/op", "allocs/op"
		for (o = 1; o <= n; o++) { m = name[o]
			printf "  %-12s %10.0f %12.0f %16.0f %8.0f %10.0f\n", m, med(v[m, "ns/op"]), med(v[m, "cpu-ns/op"]), med(v[m, "redis-cpu-ns/op"]), med(v[m, "B/op"]), med(v[m, "allocs/op"]) }
	}'
