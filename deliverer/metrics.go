package deliverer

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics of one Deliverer, registered on the registry passed to New.
type metrics struct {
	outcomes    *prometheus.CounterVec   // aurora_deliverer_outcomes_total{outcome, reason}
	skips       *prometheus.CounterVec   // aurora_deliverer_messages_skipped_total{why}
	staleLeases prometheus.Counter       // aurora_deliverer_stale_leases_total
	latency     *prometheus.HistogramVec // aurora_deliverer_provider_seconds{outcome}
	inFlight    prometheus.Gauge         // aurora_deliverer_inflight_calls
	errors      *prometheus.CounterVec   // aurora_deliverer_errors_total{op}
	attached    prometheus.Gauge         // aurora_deliverer_partitions_attached
	owned       *prometheus.GaugeVec     // aurora_deliverer_partition_owned{partition}
	loopRunning prometheus.GaugeFunc     // aurora_deliverer_consume_loop_running
	recalled    prometheus.Counter       // aurora_deliverer_deferrals_recalled_total
}

// newMetrics registers the deliverer's metrics on reg; consuming backs
// aurora_deliverer_consume_loop_running (read at every scrape).
func newMetrics(reg prometheus.Registerer, consuming func() bool) (*metrics, error) {
	m := &metrics{
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "aurora_deliverer_outcomes_total",
			Help: "Outcomes recorded by the deliverer, by outcome and quarantine reason (\"\" unless quarantined).",
		}, []string{"outcome", "reason"}),
		skips: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "aurora_deliverer_messages_skipped_total",
			Help: "Messages acknowledged or delayed without an attempt, by why (terminal, not_due, leased_live, locked, stale_dispatch, not_found, mismatch, bad_message, deferred, foreign_database, shutdown).",
		}, []string{"why"}),
		staleLeases: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "aurora_deliverer_stale_leases_total",
			Help: "Outcome writes refused because the item was reclaimed (lease_token moved): outbox.ErrStaleLease.",
		}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "aurora_deliverer_provider_seconds",
			Help:    "Duration of provider calls in seconds, by classified outcome.",
			Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"outcome"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "aurora_deliverer_inflight_calls",
			Help: "Provider calls in flight in this process.",
		}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "aurora_deliverer_errors_total",
			Help: "Infrastructure errors (Postgres, JetStream acks) by operation; the message is delayed and retried.",
		}, []string{"op"}),
		attached: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "aurora_deliverer_partitions_attached",
			Help: "Partition consumers with a running consume loop in this process (readiness needs all of them).",
		}),
		owned: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "aurora_deliverer_partition_owned",
			Help: "1 for each partition JetStream has pinned to this process (it owns that partition's lanes), as of the last attach check.",
		}, []string{"partition"}),
		recalled: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "aurora_deliverer_deferrals_recalled_total",
			Help: "Deferred rows brought forward to now because their lane had room again before the deferral's estimate (counted when the row moved).",
		}),
		loopRunning: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "aurora_deliverer_consume_loop_running",
			Help: "1 while this process consumes: Run is running and every partition consumer has a running consume loop (what /readyz needs); 0 otherwise (not started, a consumer deleted and not yet re-attached, stopped). Alert AuroraDelivererNoConsumeLoop watches it.",
		}, func() float64 {
			if consuming() {
				return 1
			}
			return 0
		}),
	}
	for _, c := range []prometheus.Collector{m.outcomes, m.skips, m.staleLeases, m.latency, m.inFlight, m.errors, m.attached, m.owned, m.loopRunning, m.recalled} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
