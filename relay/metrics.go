package relay

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/aurora-billing/aurora/shared/clock"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// Publish error kinds, the values of the "kind" label of
// aurora_relay_publish_errors_total.
const (
	errKindTimeout      = "timeout"      // no PubAck within the publish timeout
	errKindDisconnected = "disconnected" // the connection dropped with the publish in flight
	errKindNoStream     = "no_stream"    // no stream answered for the subject
	errKindOther        = "other"        // anything else (the server refused, buffer full, …)
)

// metrics are the relay's Prometheus series. They live on the registry given
// to New (WithRegistry), never on the global default registry.
type metrics struct {
	published     prometheus.Counter
	duplicates    prometheus.Counter
	publishErrors *prometheus.CounterVec
	redispatched  prometheus.Counter
	batchErrors   prometheus.Counter
	inflight      prometheus.GaugeFunc
	backlog       *backlogCollector
}

func newMetrics(pool *pgxpool.Pool, clk clock.Clock, timeout time.Duration, log *slog.Logger, inflight func() float64) *metrics {
	m := &metrics{
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "aurora_relay_published_total",
			Help: "Rows marked published: their dispatch's message got a PubAck (duplicates included).",
		}),
		duplicates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "aurora_relay_duplicates_total",
			Help: "PubAcks flagged duplicate: JetStream already held this Nats-Msg-Id (a republish of the same dispatch); counted as published.",
		}),
		publishErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "aurora_relay_publish_errors_total",
			Help: "Publishes that got no PubAck (kind: timeout, disconnected, no_stream, other); the row stays unpublished and is retried.",
		}, []string{"kind"}),
		redispatched: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "aurora_relay_redispatched_total",
			Help: "Rows whose published message was presumed lost (due and unclaimed past AURORA_RELAY_REDISPATCH_SECONDS) and got dispatch+1.",
		}),
		batchErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "aurora_relay_batch_errors_total",
			Help: "Batches or sweeps that failed (Postgres or NATS unavailable); the worker backs off.",
		}),
		inflight: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "aurora_relay_inflight_messages",
			Help: "Async publishes awaiting their PubAck, across workers (bounded by AURORA_RELAY_MAX_INFLIGHT).",
		}, inflight),
		backlog: &backlogCollector{
			pool: pool, clk: clk, timeout: timeout, log: log,
			desc: prometheus.NewDesc("aurora_relay_oldest_unpublished_age_seconds",
				"Age in seconds of the oldest row that is due and not yet published for its dispatch (0 when none). Measured by a query at scrape time; the scrape fails if the query does.",
				nil, nil),
		},
	}
	for _, k := range []string{errKindTimeout, errKindDisconnected, errKindNoStream, errKindOther} {
		m.publishErrors.WithLabelValues(k) // expose zeros
	}
	return m
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.published, m.duplicates, m.publishErrors, m.redispatched, m.batchErrors, m.inflight, m.backlog}
}

// backlogCollector measures the oldest due-but-unpublished row at scrape
// time. A failed query yields an invalid metric, so the scrape fails instead
// of reporting a zero it could not measure (a figure that cannot be measured
// is never reported as 0).
type backlogCollector struct {
	pool    *pgxpool.Pool
	clk     clock.Clock
	timeout time.Duration
	log     *slog.Logger
	desc    *prometheus.Desc
}

// errBacklogQuery is what a failed scrape reports; the cause (which may name
// the database) goes to the log only.
var errBacklogQuery = errors.New("relay: oldest-unpublished query failed")

// oldestUnpublishedSQL: due since next_attempt_at (pending) or since the
// lease expired (leased), published_dispatch < dispatch. Each branch reads
// outbox_items_unpublished_idx or outbox_items_leased_expiry_idx.
const oldestUnpublishedSQL = `
SELECT coalesce(extract(epoch FROM coalesce($1::timestamptz, now()) - min(due_at)), 0)::float8
FROM (
	(SELECT next_attempt_at AS due_at FROM outbox_items
	 WHERE state IN ('pending', 'leased') AND published_dispatch < dispatch
	   AND state = 'pending' AND next_attempt_at <= coalesce($1::timestamptz, now())
	 ORDER BY next_attempt_at LIMIT 1)
	UNION ALL
	(SELECT lease_expires_at FROM outbox_items
	 WHERE state = 'leased' AND published_dispatch < dispatch
	   AND lease_expires_at < coalesce($1::timestamptz, now())
	 ORDER BY lease_expires_at LIMIT 1)
) due`

// OldestUnpublishedAge returns the age of the oldest due row not yet
// published for its dispatch, by clk ("now" of the database unless clk
// overrides it); 0 when there is none.
func OldestUnpublishedAge(ctx context.Context, pool *pgxpool.Pool, clk clock.Clock) (time.Duration, error) {
	var secs float64
	if err := pool.QueryRow(ctx, oldestUnpublishedSQL, clock.Or(clk).Override()).Scan(&secs); err != nil {
		return 0, err
	}
	if secs < 0 {
		secs = 0
	}
	return time.Duration(secs * float64(time.Second)), nil
}

func (c *backlogCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *backlogCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	age, err := OldestUnpublishedAge(ctx, c.pool, c.clk)
	if err != nil {
		c.log.Warn("relay: backlog metric query failed", "err", err)
		ch <- prometheus.NewInvalidMetric(c.desc, errBacklogQuery)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, age.Seconds())
}
