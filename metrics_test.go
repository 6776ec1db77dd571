package redislock

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Every labelled series exists at 0 as soon as the collectors are
// registered, and counting through the made-once children reaches the same
// series as WithLabelValues.
func TestMetricsSeriesExistFromStart(t *testing.T) {
	reg := prometheus.NewRegistry()
	if err := registerMetrics(reg); err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{
		"caddy_redis_lock_requests_total": resultNames(),
		"caddy_redis_lock_renewals_total": {"ok", "not_held", "error"},
		"caddy_redis_lock_release_total":  {"released", "not_held", "error"},
	}
	for _, f := range families {
		labels, ok := want[f.GetName()]
		if !ok {
			continue
		}
		seen := map[string]bool{}
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "result" {
					seen[lp.GetValue()] = true
				}
			}
		}
		for _, l := range labels {
			if !seen[l] {
				t.Errorf("%s{result=%q} missing before any event", f.GetName(), l)
			}
		}
		delete(want, f.GetName())
	}
	if len(want) != 0 {
		t.Errorf("families not gathered: %v", want)
	}

	before := counterValue(t, metrics.requests.WithLabelValues(resultConflict))
	metrics.requests.inc(resultConflict)
	if got := counterValue(t, metrics.requests.WithLabelValues(resultConflict)); got != before+1 {
		t.Fatalf("conflict counter %v -> %v, want +1", before, got)
	}
	before = counterValue(t, metrics.requests.WithLabelValues("not_a_result"))
	metrics.requests.inc("not_a_result")
	if got := counterValue(t, metrics.requests.WithLabelValues("not_a_result")); got != before+1 {
		t.Fatalf("a label not made at init: %v -> %v, want +1", before, got)
	}
}

func counterValue(t *testing.T, c interface{ Write(*dto.Metric) error }) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
