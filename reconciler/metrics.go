package reconciler

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics is the reconciler's collector. Every value is read from the
// database at scrape time; a failed query fails the scrape (an invalid
// metric makes /metrics answer 500) rather than report a number it could
// not measure.
type Metrics struct {
	db DB

	open       *prometheus.Desc
	oldest     *prometheus.Desc
	lastOK     *prometheus.Desc
	unsettled  *prometheus.Desc
	confirmed  *prometheus.Desc
	runs       *prometheus.CounterVec
	runSeconds prometheus.Histogram
}

// NewMetrics registers the collector on reg.
func NewMetrics(reg prometheus.Registerer, db DB) *Metrics {
	m := &Metrics{
		db:        db,
		open:      prometheus.NewDesc("aurora_reconciliation_items_open", "Open reconciliation items, by kind.", []string{"kind"}, nil),
		oldest:    prometheus.NewDesc("aurora_reconciliation_oldest_open_item_age_seconds", "Age of the oldest open reconciliation item (0 when none is open).", nil, nil),
		lastOK:    prometheus.NewDesc("aurora_reconciler_last_success_timestamp_seconds", "Unix time the last successful provider run finished (0 when none has).", nil, nil),
		unsettled: prometheus.NewDesc("aurora_reconciler_unsettled_windows", "Windows holding items that the last successful run could not compare yet (younger than the settle lag, or an item still being sent).", nil, nil),
		confirmed: prometheus.NewDesc("aurora_outbox_items_confirmed", "Outbox items in state confirmed.", nil, nil),
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "aurora_reconciler_runs_total",
			Help: "Provider runs by result (ok, provider_error, error)."}, []string{"result"}),
		runSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "aurora_reconciler_run_seconds",
			Help: "Duration of provider runs.", Buckets: prometheus.ExponentialBuckets(0.05, 2, 14)}),
	}
	reg.MustRegister(m, m.runs, m.runSeconds)
	return m
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.open
	ch <- m.oldest
	ch <- m.lastOK
	ch <- m.unsettled
	ch <- m.confirmed
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	byKind, err := CountByKind(ctx, m.db, StateOpen)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(m.open, err)
	} else {
		for _, k := range Kinds {
			ch <- prometheus.MustNewConstMetric(m.open, prometheus.GaugeValue, float64(byKind[k]), string(k))
		}
	}
	var age, last, unsettled, confirmed float64
	err = m.db.QueryRow(ctx, `SELECT
			coalesce((SELECT extract(epoch FROM now() - min(first_seen_at)) FROM reconciliation_items WHERE state = 'open'), 0)::float8,
			coalesce((SELECT extract(epoch FROM max(finished_at)) FROM reconciler_runs WHERE ok AND kind = 'provider'), 0)::float8,
			coalesce((SELECT windows_unsettled FROM reconciler_runs WHERE ok AND kind = 'provider' ORDER BY finished_at DESC, id DESC LIMIT 1), 0)::float8,
			(SELECT count(*) FROM outbox_items WHERE state = 'confirmed')::float8`).Scan(&age, &last, &unsettled, &confirmed)
	if err != nil {
		for _, d := range []*prometheus.Desc{m.oldest, m.lastOK, m.unsettled, m.confirmed} {
			ch <- prometheus.NewInvalidMetric(d, err)
		}
		return
	}
	ch <- prometheus.MustNewConstMetric(m.oldest, prometheus.GaugeValue, max(0, age))
	ch <- prometheus.MustNewConstMetric(m.lastOK, prometheus.GaugeValue, last)
	ch <- prometheus.MustNewConstMetric(m.unsettled, prometheus.GaugeValue, unsettled)
	ch <- prometheus.MustNewConstMetric(m.confirmed, prometheus.GaugeValue, confirmed)
}

// observeRun counts one run.
func (m *Metrics) observeRun(result string, d time.Duration) {
	if m == nil {
		return
	}
	m.runs.WithLabelValues(result).Inc()
	m.runSeconds.Observe(d.Seconds())
}
