package main

import (
	"bytes"
	"math"
	"strings"
	"testing"
)

const twoScrapes = `# scrape 1.0
# HELP caddy_redis_lock_requests_total Requests.
# TYPE caddy_redis_lock_requests_total counter
caddy_redis_lock_requests_total{result="acquired"} 10
caddy_redis_lock_requests_total{result="conflict"} 0
# HELP caddy_redis_lock_wait_seconds Wait.
# TYPE caddy_redis_lock_wait_seconds histogram
caddy_redis_lock_wait_seconds_bucket{le="0.001"} 5
caddy_redis_lock_wait_seconds_bucket{le="0.01"} 10
caddy_redis_lock_wait_seconds_bucket{le="+Inf"} 10
caddy_redis_lock_wait_seconds_sum 0.02
caddy_redis_lock_wait_seconds_count 10
# scrape 3.0
# HELP caddy_redis_lock_requests_total Requests.
# TYPE caddy_redis_lock_requests_total counter
caddy_redis_lock_requests_total{result="acquired"} 30
caddy_redis_lock_requests_total{result="conflict"} 4
# HELP caddy_redis_lock_wait_seconds Wait.
# TYPE caddy_redis_lock_wait_seconds histogram
caddy_redis_lock_wait_seconds_bucket{le="0.001"} 5
caddy_redis_lock_wait_seconds_bucket{le="0.01"} 30
caddy_redis_lock_wait_seconds_bucket{le="+Inf"} 30
caddy_redis_lock_wait_seconds_sum 0.2
caddy_redis_lock_wait_seconds_count 30
# fault 2.0 redis-pause
`

// Rates per second between scrapes, the quantile of the observations in
// between, a counter that restarts, and an SVG that names the series.
func TestPlot(t *testing.T) {
	scrapes, faults, err := read(strings.NewReader(twoScrapes))
	if err != nil {
		t.Fatal(err)
	}
	if len(scrapes) != 2 || len(faults) != 1 || faults[0].name != "redis-pause" {
		t.Fatalf("read %d scrapes, faults %v", len(scrapes), faults)
	}
	ps := panels(scrapes, faults)
	var acquired, conflict float64
	for _, s := range ps[0].lines {
		switch s.name {
		case "acquired":
			acquired = s.pts[0][1]
		case "conflict":
			conflict = s.pts[0][1]
		}
	}
	if acquired != 10 || conflict != 2 {
		t.Errorf("rates acquired %v, conflict %v; want 10 and 2 per second", acquired, conflict)
	}
	// The 20 observations between the scrapes all fell in (1ms, 10ms].
	if q := quantile(scrapes[0], scrapes[1], "caddy_redis_lock_wait_seconds", 0.5); math.Abs(q-0.0055) > 1e-9 {
		t.Errorf("p50 %v, want 5.5ms", q)
	}
	if increase(30, 4) != 4 || increase(4, 30) != 26 {
		t.Error("increase across a restart")
	}
	var out bytes.Buffer
	draw(&out, scrapes, faults)
	for _, want := range []string{"<svg", "acquired", "conflict", "redis-pause", "p99"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the SVG lacks %q", want)
		}
	}
}
