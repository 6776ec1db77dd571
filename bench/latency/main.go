// Command latency measures the latency that redis_lock adds at a constant
// request rate: an open-loop load (vegeta's attacker, which sends on
// schedule whether or not earlier answers came, as real clients do) against
// a plain reverse_proxy site, a redis_lock site and an idempotency site of
// one Caddy (and, with -floor, the load test's floor site: the two round
// trips of a bare lock and nothing else, internal/floor), in alternating
// order, round after round, at each rate. It prints p50, p90 and p99 of each
// route with its ratio to plain in the same round (medians over the rounds),
// so that the machine's drift cancels out, and with -floor what each route
// adds to the floor's p50 in the same round.
// A round in which the VM's host took the CPU (steal) is run again, as in
// make loadtest.
//
//	go run ./latency -plain URL -locked URL -idem URL [-floor URL] [-rates 100,500] [-duration 10s] [-rounds 3] [-max-steal 5]
//
// Every request is a POST with a JSON body and an Idempotency-Key of its
// own: the lock and the record are taken and given back each time.
package main

import (
	"flag"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

func main() {
	plain := flag.String("plain", "", "URL of the plain reverse_proxy site")
	locked := flag.String("locked", "", "URL of the redis_lock site")
	idem := flag.String("idem", "", "URL of the redis_lock + idempotency site")
	floor := flag.String("floor", "", "URL of the floor site (optional): a bare lock's two round trips")
	rates := flag.String("rates", "100,500", "request rates per second, comma-separated")
	duration := flag.Duration("duration", 10*time.Second, "length of one run")
	rounds := flag.Int("rounds", 3, "rounds: each runs every route at every rate once")
	maxSteal := flag.Float64("max-steal", 5, "a round in which the VM's host took more than this % of the CPU (steal) is run again, up to 3x the rounds in all")
	flag.Parse()
	if *plain == "" || *locked == "" || *idem == "" {
		fmt.Fprintln(os.Stderr, "latency: -plain, -locked and -idem are required")
		os.Exit(2)
	}
	routes := []route{{"plain", *plain}}
	if *floor != "" {
		routes = append(routes, route{"floor", *floor})
	}
	routes = append(routes, route{"lock", *locked}, route{"idempotency", *idem})
	var rs []int
	for _, f := range strings.Split(*rates, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			fmt.Fprintf(os.Stderr, "latency: bad rate %q\n", f)
			os.Exit(2)
		}
		rs = append(rs, n)
	}

	failed := false
	for _, rate := range rs {
		ratios := make([][3][]float64, len(routes))   // route, quantile: per-round ratio to plain
		absolute := make([][3][]float64, len(routes)) // route, quantile: ms
		overFloor := make([][]float64, len(routes))   // route: per-round p50 less the floor's, ms
		for round, tries := 0, 0; round < *rounds; round, tries = round+1, tries+1 {
			q := make([][3]time.Duration, len(routes))
			s0 := readCPUStat()
			for i := range routes {
				// Alternate the order so that no route always goes first.
				k := (i + round) % len(routes)
				m := attack(routes[k], rate, *duration, round)
				if m.Success < 1 {
					fmt.Fprintf(os.Stderr, "latency: %s at %d/s: success %.4f, status codes %v, errors %v\n",
						routes[k].name, rate, m.Success, m.StatusCodes, m.Errors)
					failed = true
				}
				q[k] = [3]time.Duration{m.Latencies.P50, m.Latencies.P90, m.Latencies.P99}
				fmt.Printf("rate %4d/s  round %d  %-12s p50 %7.3f ms  p90 %7.3f ms  p99 %7.3f ms\n",
					rate, round+1, routes[k].name, ms(q[k][0]), ms(q[k][1]), ms(q[k][2]))
			}
			// A round whose CPU the host took measures the neighbours:
			// shown, then run again.
			steal := readCPUStat().stealSince(s0)
			if steal > *maxSteal && tries < 3*(*rounds) {
				fmt.Printf("rate %4d/s  round %d: steal %.0f%%, above %.0f%%: not counted, run again\n", rate, round+1, steal, *maxSteal)
				round--
				continue
			}
			fmt.Printf("rate %4d/s  round %d: steal %.0f%%\n", rate, round+1, steal)
			for k := range routes {
				for j := range 3 {
					absolute[k][j] = append(absolute[k][j], ms(q[k][j]))
					ratios[k][j] = append(ratios[k][j], float64(q[k][j])/float64(q[0][j]))
				}
				if *floor != "" {
					overFloor[k] = append(overFloor[k], ms(q[k][0]-q[1][0]))
				}
			}
		}
		fmt.Printf("\n== %d req/s, %s per run, medians of %d rounds\n", rate, *duration, *rounds)
		fmt.Printf("%-12s %9s %9s %9s   %8s %8s %8s", "route", "p50 ms", "p90 ms", "p99 ms", "p50/plain", "p90/plain", "p99/plain")
		if *floor != "" {
			// What a route adds to the floor, a bare lock's round trips in
			// the same round: the part of its latency that is its own.
			fmt.Printf(" %14s", "p50-floor ms")
		}
		fmt.Println()
		for k, r := range routes {
			fmt.Printf("%-12s %9.3f %9.3f %9.3f   %8.2f %9.2f %9.2f", r.name,
				median(absolute[k][0]), median(absolute[k][1]), median(absolute[k][2]),
				median(ratios[k][0]), median(ratios[k][1]), median(ratios[k][2]))
			if *floor != "" {
				fmt.Printf(" %+14.3f", median(overFloor[k]))
			}
			fmt.Println()
		}
		fmt.Println()
	}
	if failed {
		fmt.Fprintln(os.Stderr, "latency: some requests failed (non-2xx answers or errors)")
		os.Exit(1)
	}
}

type route struct{ name, url string }

var seq atomic.Int64

// attack runs one open-loop load of rate requests per second on r for d.
func attack(r route, rate int, d time.Duration, round int) vegeta.Metrics {
	prefix := fmt.Sprintf("lat-%d-%d-%s-%d-", os.Getpid(), rate, r.name, round)
	body := []byte(`{"amount":1299,"currency":"eur"}`)
	targeter := func(t *vegeta.Target) error {
		t.Method, t.URL, t.Body = http.MethodPost, r.url, body
		t.Header = http.Header{
			"Content-Type":    {"application/json"},
			"Idempotency-Key": {prefix + strconv.FormatInt(seq.Add(1), 10)},
		}
		return nil
	}
	attacker := vegeta.NewAttacker(vegeta.KeepAlive(true), vegeta.Timeout(10*time.Second))
	var m vegeta.Metrics
	for res := range attacker.Attack(targeter, vegeta.Rate{Freq: rate, Per: time.Second}, d, r.name) {
		m.Add(res)
	}
	m.Close()
	return m
}

// cpuStat is the machine's steal and total CPU time (/proc/stat), zero
// where there is none (not Linux).
type cpuStat struct{ steal, total float64 }

func readCPUStat() cpuStat {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuStat{}
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	var c cpuStat
	for i, v := range f[1:] {
		n, _ := strconv.ParseFloat(v, 64)
		if i < 8 { // user .. steal; guest time is counted in user already
			c.total += n
		}
		if i == 7 {
			c.steal = n
		}
	}
	return c
}

// stealSince is the % of the CPU time since s0 that the host took.
func (c cpuStat) stealSince(s0 cpuStat) float64 {
	if c.total <= s0.total {
		return 0
	}
	return 100 * (c.steal - s0.steal) / (c.total - s0.total)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
