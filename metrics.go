package redislock

import (
	"errors"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
	"github.com/reqlock/caddy-redis-lock/internal/redisscript"
)

// metrics are created once and registered on every config's registry, so
// that config reloads keep counting. No label holds request data.
var metrics = struct {
	once     sync.Once
	requests labelled
	wait     prometheus.Histogram
	hold     prometheus.Histogram
	renewals labelled
	lost     prometheus.Counter
	release  labelled
	stored   prometheus.Histogram
	unacked  labelled
	unknown  prometheus.Counter
	settled  labelled
	givenUp  labelled
	retries  labelled
	retried  labelled
}{}

// labelled is a counter with a result label whose counters for the known
// results are made once: WithLabelValues hashes its label on every call,
// and a series that exists at 0 from the start shows on dashboards before
// its first event.
type labelled struct {
	*prometheus.CounterVec
	by map[string]prometheus.Counter
}

func newLabelled(opts prometheus.CounterOpts, known ...string) labelled {
	return newLabelledBy(opts, "result", known...)
}

// newLabelledBy is newLabelled with a label of another name.
func newLabelledBy(opts prometheus.CounterOpts, label string, known ...string) labelled {
	l := labelled{prometheus.NewCounterVec(opts, []string{label}), make(map[string]prometheus.Counter, len(known))}
	for _, r := range known {
		l.by[r] = l.WithLabelValues(r)
	}
	return l
}

// inc counts one event with result; a known result is one map lookup.
func (l labelled) inc(result string) {
	if c, ok := l.by[result]; ok {
		c.Inc()
		return
	}
	l.WithLabelValues(result).Inc()
}

func initMetrics() {
	const ns, sub = "caddy", "redis_lock"
	buckets := []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}
	metrics.requests = newLabelled(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "requests_total",
		Help: resultsHelp(),
	}, resultNames()...)
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
	metrics.renewals = newLabelled(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "renewals_total",
		Help: "Keep-alive refreshes, by result (ok, not_held, error).",
	}, "ok", "not_held", "error")
	metrics.lost = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "lost_total",
		Help: "Locks lost while their request was in flight.",
	})
	metrics.release = newLabelled(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "release_total",
		Help: "Lock releases, by result (released, not_held, error).",
	}, "released", "not_held", "error")
	metrics.stored = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: ns, Subsystem: sub, Name: "stored_response_bytes",
		Help:    "Size of the responses stored for idempotency (body and headers).",
		Buckets: prometheus.ExponentialBuckets(64, 4, 9), // 64 B to 4 MiB
	})
	metrics.unknown = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "outcomes_unknown_total",
		Help: "Outcome-unknown records stored (the backend was reached and its answer never came): each needs a look at the backend, then DEL of its record key.",
	})
	metrics.unacked = newLabelledBy(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "replication_misses_total",
		Help: "Writes that fewer replicas than `replicas` acknowledged in time, by write (lock: answered 503; renewal: the lease not extended; answer: sent, and written again in the background).",
	}, "write", writeLock, writeRenewal, writeAnswer)
	metrics.settled = newLabelledBy(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "settled_total",
		Help: "Idempotent requests that waited after Redis recovered from an outage, so that the answers given while it was away are stored first, by step (waited: before the begin; begun_again: begun as Redis recovered, given back and begun again).",
	}, "step", settleWaited, settleBegunAgain)
	metrics.givenUp = newLabelledBy(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "answers_given_up_total",
		Help: "Answers a node could not store in Redis, by the record left in their place (outcome_unknown: Redis did not take the answer in time while the lock was held, and retries get 502; none: nothing stored; the record is left in progress, abandoned once its lease ends, and retries get 502).",
	}, "record", givenUpUnknown, givenUpNone)
	metrics.retries = newLabelledBy(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "cluster_retries_total",
		Help: "Redis Cluster calls tried again because the Cluster did not run them, by cause (moved, ask, tryagain: a slot migrating; clusterdown, readonly, connection, unreplicated: a master failing over; loading, masterdown).",
	}, "cause", redisscript.Causes...)
	metrics.retried = newLabelledBy(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "cluster_retries_exhausted_total",
		Help: "Redis Cluster calls whose deadline passed while they were tried again, by the cause of the last try: an acquire or begin answered 503, a renewal, release or stored answer that failed.",
	}, "cause", redisscript.Causes...)
}

// observeRetry is the Redis connection's RetryObserver.
func observeRetry(cause string, exhausted bool) {
	metrics.once.Do(initMetrics)
	if exhausted {
		metrics.retried.inc(cause)
		return
	}
	metrics.retries.inc(cause)
}

// The records that answers_given_up_total counts.
const (
	givenUpUnknown = "outcome_unknown"
	givenUpNone    = "none"
)

// The steps that settled_total counts.
const (
	settleWaited     = "waited"
	settleBegunAgain = "begun_again"
)

// The writes that replication_misses_total counts.
const (
	writeLock    = "lock"
	writeRenewal = "renewal"
	writeAnswer  = "answer"
)

// registerMetrics adds the collectors to reg; already registered ones (a
// second handler, a reload on the same registry) are fine.
func registerMetrics(reg *prometheus.Registry) error {
	metrics.once.Do(initMetrics)
	if reg == nil {
		return nil
	}
	for _, c := range []prometheus.Collector{
		metrics.requests.CounterVec, metrics.wait, metrics.hold, metrics.renewals.CounterVec, metrics.lost, metrics.release.CounterVec, metrics.stored, metrics.unacked.CounterVec, metrics.unknown, metrics.settled.CounterVec, metrics.givenUp.CounterVec,
		metrics.retries.CounterVec, metrics.retried.CounterVec,
	} {
		var are prometheus.AlreadyRegisteredError
		if err := reg.Register(c); err != nil && !errors.As(err, &are) {
			return fmt.Errorf("registering metrics: %w", err)
		}
	}
	return nil
}

// observeRenew is the lock library's OnRenew hook.
func observeRenew(err error) {
	observeOutcome(metrics.renewals, "ok", err)
	if errors.Is(err, engine.ErrNotReplicated) {
		metrics.unacked.inc(writeRenewal)
	}
}

// observeRelease counts a release by its outcome.
func observeRelease(err error) { observeOutcome(metrics.release, "released", err) }

// observeOutcome counts err on c: okLabel, not_held or error.
func observeOutcome(c labelled, okLabel string, err error) {
	label := "error"
	switch {
	case err == nil:
		label = okLabel
	case errors.Is(err, engine.ErrNotHeld):
		label = "not_held"
	}
	c.inc(label)
}
