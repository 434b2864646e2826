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

// Reasons a published row is not marked, the values of the "reason" label
// of aurora_relay_marks_skipped_total (markPublishedSQL).
const (
	skipMoved  = "moved_on" // the dispatch moved on before the mark
	skipLocked = "locked"   // another transaction held the row: queued again
)

// metrics are the relay's Prometheus series. They live on the registry given
// to New (WithRegistry), never on the global default registry.
type metrics struct {
	published     prometheus.Counter
	batchMessages prometheus.Counter
	duplicates    prometheus.Counter
	publishErrors *prometheus.CounterVec
	redispatched  prometheus.Counter
	marksSkipped  *prometheus.CounterVec
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
		batchMessages: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "aurora_relay_batch_messages_total",
			Help: "Batch messages that got a PubAck (several items in one message: AURORA_RELAY_BATCH_MESSAGE_ITEMS above 1 and a partition consumer that accepts them).",
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
		marksSkipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "aurora_relay_marks_skipped_total",
			Help: "Acknowledged rows the batch did not mark published (reason: moved_on, the dispatch moved on before the mark, its new dispatch is queued on its own; locked, a deliverer or operator held the row, queued again for the next batch to judge).",
		}, []string{"reason"}),
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
	for _, k := range []string{skipMoved, skipLocked} {
		m.marksSkipped.WithLabelValues(k)
	}
	return m
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.published, m.batchMessages, m.duplicates, m.publishErrors, m.redispatched, m.marksSkipped, m.batchErrors, m.inflight, m.backlog}
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

// oldestUnpublishedSQL: the oldest due time among items that are due
// (pending since next_attempt_at, or leased since the lease expired) and
// unpublished for their dispatch. It reads the first 1,000 such items in
// outbox_publish_queue's due_at order (outbox_publish_queue_due_idx; queue
// rows whose item moved on are skipped) and takes the oldest of their own
// due times: a queue row's due_at is when it was queued to be looked at,
// normally the item's due time, so the bound costs a scrape nothing in
// exactness unless a thousand items' due times moved after they were
// queued.
const oldestUnpublishedSQL = `
WITH clk AS (SELECT coalesce($1::timestamptz, now()) AS now)
SELECT coalesce(extract(epoch FROM clk.now - (
    SELECT min(d.due) FROM (
        SELECT CASE WHEN o.state = 'leased' THEN o.lease_expires_at ELSE o.next_attempt_at END AS due
        FROM outbox_publish_queue q
        JOIN outbox_items o ON o.id = q.item_id AND o.dispatch = q.dispatch
        WHERE q.due_at <= clk.now AND o.published_dispatch < o.dispatch
          AND ((o.state = 'pending' AND o.next_attempt_at <= clk.now)
               OR (o.state = 'leased' AND o.lease_expires_at < clk.now))
        ORDER BY q.due_at
        LIMIT 1000) d)), 0)::float8
FROM clk`

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
