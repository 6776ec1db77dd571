package redislock

// The dashboard and alert rules under deploy/ name only metrics the plugin
// exports: a renamed metric fails here, not on someone's wall at night.

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func TestDeployNamesExportedMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	if err := registerMetrics(reg); err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]dto.MetricType{}
	for _, f := range families {
		kinds[f.GetName()] = f.GetType()
	}
	name := regexp.MustCompile(`caddy_redis_lock_[a-z_]+`)
	for _, file := range []string{"deploy/prometheus/alerts.yml", "deploy/grafana/caddy-redis-lock.json"} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		names := name.FindAllString(string(b), -1)
		if len(names) == 0 {
			t.Errorf("%s names no metric", file)
		}
		for _, n := range names {
			base, kind := n, kinds[n]
			if _, ok := kinds[n]; !ok {
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if b, ok := strings.CutSuffix(n, suffix); ok && kinds[b] == dto.MetricType_HISTOGRAM {
						base, kind = b, dto.MetricType_HISTOGRAM
					}
				}
			}
			if _, ok := kinds[base]; !ok {
				t.Errorf("%s names %s, which the plugin does not export", file, n)
				continue
			}
			if strings.HasSuffix(n, "_bucket") && kind != dto.MetricType_HISTOGRAM {
				t.Errorf("%s reads buckets of %s, which is not a histogram", file, base)
			}
		}
	}
}
