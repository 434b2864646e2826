package inbox

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the inbox's Prometheus series:
//
//	aurora_inbox_webhooks_total{result}            webhook requests by result (stored, duplicate, bad_signature, …)
//	aurora_inbox_webhook_duration_seconds           webhook request latency (verify + store)
//	aurora_inbox_worker_events_total{result}        worker outcomes per event (applied, deferred, quarantined, …)
//	aurora_inbox_pending                            pending events (seed 003 inventory "pending")
//	aurora_inbox_dead_letters{reason}               dead letters by reason
//	aurora_inbox_oldest_pending_age_seconds         age of the oldest pending event (received_at), 0 when none
//	aurora_inbox_highest_attempt_count              max attempts of unprocessed events
//
// The gauges are read from the database at scrape time; a failed read makes
// the scrape fail rather than report a wrong value. A nil *Metrics is valid
// and records nothing.
type Metrics struct {
	webhooks *prometheus.CounterVec
	latency  prometheus.Histogram
	worker   *prometheus.CounterVec
}

// NewMetrics registers the inbox's series on reg. pool may be nil (no
// gauges, e.g. in benchmarks).
func NewMetrics(reg prometheus.Registerer, pool *pgxpool.Pool) *Metrics {
	m := &Metrics{
		webhooks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "aurora_inbox_webhooks_total", Help: "Stripe webhook requests by result.",
		}, []string{"result"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "aurora_inbox_webhook_duration_seconds", Help: "Webhook request latency: verify and store.",
			Buckets: []float64{.001, .002, .005, .01, .02, .05, .1, .25, .5, 1, 2.5, 10},
		}),
		worker: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "aurora_inbox_worker_events_total", Help: "Worker outcomes per event.",
		}, []string{"result"}),
	}
	reg.MustRegister(m.webhooks, m.latency, m.worker)
	if pool != nil {
		reg.MustRegister(&queueCollector{pool: pool})
	}
	return m
}

func (m *Metrics) webhook(result string, d time.Duration) {
	if m == nil {
		return
	}
	m.webhooks.WithLabelValues(result).Inc()
	m.latency.Observe(d.Seconds())
}

func (m *Metrics) workerResult(r Result) {
	if m == nil {
		return
	}
	m.worker.WithLabelValues(string(r)).Inc()
}

var (
	descPending = prometheus.NewDesc("aurora_inbox_pending", "Pending Stripe events (not processed, not dead-lettered).", nil, nil)
	descDead    = prometheus.NewDesc("aurora_inbox_dead_letters", "Dead-lettered Stripe events by reason.", []string{"reason"}, nil)
	descOldest  = prometheus.NewDesc("aurora_inbox_oldest_pending_age_seconds", "Age in seconds of the oldest pending event.", nil, nil)
	descHighest = prometheus.NewDesc("aurora_inbox_highest_attempt_count", "Highest attempt count among unprocessed events.", nil, nil)
)

// queueCollector reads the queue gauges at scrape time.
type queueCollector struct{ pool *pgxpool.Pool }

func (c *queueCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descPending
	ch <- descDead
	ch <- descOldest
	ch <- descHighest
}

func (c *queueCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	inv, err := ReadInventory(ctx, c.pool)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(descPending, err)
		return
	}
	var oldest float64
	if err := c.pool.QueryRow(ctx, `
SELECT coalesce(extract(epoch FROM now() - min(received_at)), 0)::float8
  FROM billing_events WHERE processed_at IS NULL AND dead_letter_at IS NULL`).Scan(&oldest); err != nil {
		ch <- prometheus.NewInvalidMetric(descOldest, err)
		return
	}
	rows, err := c.pool.Query(ctx, `
SELECT coalesce(last_reason, ''), count(*) FROM billing_events
 WHERE processed_at IS NULL AND dead_letter_at IS NOT NULL GROUP BY 1`)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(descDead, err)
		return
	}
	byReason := map[string]float64{}
	for rows.Next() {
		var r string
		var n int64
		if err := rows.Scan(&r, &n); err != nil {
			rows.Close()
			ch <- prometheus.NewInvalidMetric(descDead, err)
			return
		}
		byReason[r] = float64(n)
	}
	if err := rows.Err(); err != nil {
		ch <- prometheus.NewInvalidMetric(descDead, err)
		return
	}
	ch <- prometheus.MustNewConstMetric(descPending, prometheus.GaugeValue, float64(inv.Pending))
	ch <- prometheus.MustNewConstMetric(descOldest, prometheus.GaugeValue, oldest)
	var highest float64
	if inv.HighestAttemptCount != nil {
		highest = float64(*inv.HighestAttemptCount)
	}
	ch <- prometheus.MustNewConstMetric(descHighest, prometheus.GaugeValue, highest)
	for _, r := range Reasons {
		ch <- prometheus.MustNewConstMetric(descDead, prometheus.GaugeValue, byReason[string(r)], string(r))
	}
}
