#!/usr/bin/env bash
# Lock library benchmarks: this library beside bsm/redislock, redsync,
# rueidislock and a raw floor, all against one redis-server that the
# benchmark binary starts itself. Prints a benchstat table by library and the
# project's targets for the parallel-distinct-keys shape.
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
rm -f "$bin"
echo "raw output: bench/$out"
echo

go run "$benchstat" -col /lib "$out"

# Targets, parallel distinct keys, from the medians: reqlock ns/op <= bsm's
# and <= 1.15x raw's; allocs/op below bsm's.
awk '
	/^BenchmarkParallelDistinct\/lib=/ {
		split($1, a, "="); lib = a[2]; sub(/-[0-9]+$/, "", lib)
		for (i = 3; i < NF; i++) {
			if ($(i+1) == "ns/op") ns[lib, ++nn[lib]] = $i
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
		print ""
		print "Targets, ParallelDistinct (medians):"
		printf "  reqlock/bsm ns/op    %.3f  (target <= 1.00)  %s\n", r / b, (r <= b ? "met" : "MISSED")
		printf "  reqlock/raw ns/op    %.3f  (target <= 1.15)  %s\n", r / w, (r <= 1.15 * w ? "met" : "MISSED")
		printf "  allocs/op reqlock %d, bsm %d  (target: fewer)  %s\n", ra, ba, (ra < ba ? "met" : "MISSED")
	}
' "$out"
