package redislock

import (
	"errors"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/reqlock/caddy-redis-lock/lock"
)

// metrics are created once and registered on every config's registry, so
// that config reloads keep counting. No label holds request data.
var metrics = struct {
	once     sync.Once
	requests *prometheus.CounterVec
	wait     prometheus.Histogram
	hold     prometheus.Histogram
	renewals *prometheus.CounterVec
	lost     prometheus.Counter
	release  *prometheus.CounterVec

	// The labelled counters for every result, made once: WithLabelValues
	// hashes its label on every call, and a series that exists at 0 from
	// the start shows on dashboards before its first event.
	requestsBy, renewalsBy, releaseBy map[string]prometheus.Counter
}{}

// results are the values of the result label of requests_total.
var results = []string{resultAcquired, resultConflict, resultBypassed, resultFailOpen,
	resultRejected, resultUnavailable, resultLost, resultCancelled, resultTooEarly}

// children makes vec's counter for each label value.
func children(vec *prometheus.CounterVec, labels ...string) map[string]prometheus.Counter {
	m := make(map[string]prometheus.Counter, len(labels))
	for _, l := range labels {
		m[l] = vec.WithLabelValues(l)
	}
	return m
}

// inc counts one event under label; a label made at init is one map lookup.
func inc(by map[string]prometheus.Counter, vec *prometheus.CounterVec, label string) {
	if c, ok := by[label]; ok {
		c.Inc()
		return
	}
	vec.WithLabelValues(label).Inc()
}

func initMetrics() {
	const ns, sub = "caddy", "redis_lock"
	buckets := []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}
	metrics.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "requests_total",
		Help: "Requests seen by redis_lock, by result (acquired, conflict, bypassed, fail_open, rejected, unavailable, lost, cancelled, too_early).",
	}, []string{"result"})
	metrics.wait = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: ns, Subsystem: sub, Name: "wait_seconds",
		Help:    "Time to acquire a lock or give up on it, waiting included.",
		Buckets: buckets,
	})
	metrics.hold = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: ns, Subsystem: sub, Name: "hold_seconds",
		Help:    "Time a lock was held, from acquire to release.",
		Buckets: buckets,
	})
	metrics.renewals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "renewals_total",
		Help: "Keep-alive refreshes, by result (ok, not_held, error).",
	}, []string{"result"})
	metrics.lost = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "lost_total",
		Help: "Locks lost while their request was in flight.",
	})
	metrics.release = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "release_total",
		Help: "Lock releases, by result (released, not_held, error).",
	}, []string{"result"})
	metrics.requestsBy = children(metrics.requests, results...)
	metrics.renewalsBy = children(metrics.renewals, "ok", "not_held", "error")
	metrics.releaseBy = children(metrics.release, "released", "not_held", "error")
}

// registerMetrics adds the collectors to reg; already registered ones (a
// second handler, a reload on the same registry) are fine.
func registerMetrics(reg *prometheus.Registry) error {
	metrics.once.Do(initMetrics)
	if reg == nil {
		return nil
	}
	for _, c := range []prometheus.Collector{
		metrics.requests, metrics.wait, metrics.hold, metrics.renewals, metrics.lost, metrics.release,
	} {
		var are prometheus.AlreadyRegisteredError
		if err := reg.Register(c); err != nil && !errors.As(err, &are) {
			return fmt.Errorf("registering metrics: %w", err)
		}
	}
	return nil
}

// observeRenew is the lock library's OnRenew hook.
func observeRenew(err error) { observeOutcome(metrics.renewalsBy, metrics.renewals, "ok", err) }

// observeRelease counts a release by its outcome.
func observeRelease(err error) { observeOutcome(metrics.releaseBy, metrics.release, "released", err) }

// observeOutcome counts err on vec: okLabel, not_held or error.
func observeOutcome(by map[string]prometheus.Counter, vec *prometheus.CounterVec, okLabel string, err error) {
	label := "error"
	switch {
	case err == nil:
		label = okLabel
	case errors.Is(err, lock.ErrNotHeld):
		label = "not_held"
	}
	inc(by, vec, label)
}
