package gauge

import (
	"context"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
)

// Metric names exported by Collector. The alert rules
// (deploy/prometheus/alerts.yml), the dashboard and RUNBOOK.md use them.
const (
	MetricBacklogAge          = "aurora_db_outbox_backlog_age_seconds"
	MetricOutboxItems         = "aurora_db_outbox_items"
	MetricUncertainOldestAge  = "aurora_db_outbox_uncertain_oldest_age_seconds"
	MetricQuarantined         = "aurora_db_outbox_quarantined_items"
	MetricLastItemID          = "aurora_db_outbox_last_item_id"
	MetricInboxPending        = "aurora_db_inbox_pending_events"
	MetricInboxDeadLetters    = "aurora_db_inbox_dead_letters"
	MetricInboxHighestAttempt = "aurora_db_inbox_highest_pending_attempts"
	MetricInboxOldestPending  = "aurora_db_inbox_oldest_pending_age_seconds"
	MetricReconOpen           = "aurora_db_reconciliation_open_items"
	MetricReconOldest         = "aurora_db_reconciliation_oldest_open_age_seconds"
	MetricEventsUndispatched  = "aurora_db_events_undispatched_oldest_age_seconds"
	MetricEventsDeadLetters   = "aurora_db_events_dead_letters"
	MetricEventsConsumerDead  = "aurora_db_events_consumer_dead_letters"
	MetricEventsConsumerLag   = "aurora_db_events_consumer_lag_seconds"
	MetricCountCap            = "aurora_db_count_cap"
)

var (
	descBacklogAge = prometheus.NewDesc(MetricBacklogAge,
		"Seconds since the oldest outbox item in this state (pending, leased, accepted: states something automatic still moves) was staged; 0 when none.",
		[]string{"state"}, nil)
	descOutboxItems = prometheus.NewDesc(MetricOutboxItems,
		"Outbox items in this state (pending, leased, uncertain, quarantined), capped at aurora_db_count_cap.",
		[]string{"state"}, nil)
	descUncertainOldest = prometheus.NewDesc(MetricUncertainOldestAge,
		"Seconds since the oldest uncertain outbox item became uncertain; 0 when none.", nil, nil)
	descQuarantined = prometheus.NewDesc(MetricQuarantined,
		"Quarantined outbox items by reason, each capped at aurora_db_count_cap.", []string{"reason"}, nil)
	descLastItemID = prometheus.NewDesc(MetricLastItemID,
		"Highest outbox_items id; grows by one per staged item, so rate() of it is the staging rate.", nil, nil)
	descInboxPending = prometheus.NewDesc(MetricInboxPending,
		"Stripe webhook events neither processed nor dead-lettered, capped at aurora_db_count_cap.", nil, nil)
	descInboxDead = prometheus.NewDesc(MetricInboxDeadLetters,
		"Dead-lettered Stripe webhook events by reason (total capped at aurora_db_count_cap).", []string{"reason"}, nil)
	descInboxHighest = prometheus.NewDesc(MetricInboxHighestAttempt,
		"Highest attempt count among pending Stripe webhook events (dead letters excluded).", nil, nil)
	descInboxOldest = prometheus.NewDesc(MetricInboxOldestPending,
		"Seconds since the oldest pending Stripe webhook event was received; 0 when none.", nil, nil)
	descReconOpen = prometheus.NewDesc(MetricReconOpen,
		"Open reconciliation items by kind (read over the aurora_db_count_cap oldest open items).", []string{"kind"}, nil)
	descReconOldest = prometheus.NewDesc(MetricReconOldest,
		"Seconds since the oldest open reconciliation item of this kind was first seen; 0 when none.", []string{"kind"}, nil)
	descEventsUndispatched = prometheus.NewDesc(MetricEventsUndispatched,
		"Seconds since the oldest domain event not yet on the stream (pending or failed) was published; 0 when none.", nil, nil)
	descEventsDead = prometheus.NewDesc(MetricEventsDeadLetters,
		"Domain events in dead_letter (dispatch gave up, or every consumer dead-lettered them), capped at aurora_db_count_cap.", nil, nil)
	descEventsConsumerDead = prometheus.NewDesc(MetricEventsConsumerDead,
		"Domain events dead-lettered for this consumer, capped at aurora_db_count_cap.", []string{"consumer"}, nil)
	descEventsConsumerLag = prometheus.NewDesc(MetricEventsConsumerLag,
		"Seconds since the oldest dispatched event of this consumer's types it has neither processed nor dead-lettered was dispatched; 0 when none. Grows while the consumer is down.", []string{"consumer"}, nil)
	descCountCap = prometheus.NewDesc(MetricCountCap,
		"The most rows one count reads (AURORA_GAUGES_COUNT_CAP): a count equal to it means at least this many.", nil, nil)
)

var allDescs = []*prometheus.Desc{descBacklogAge, descOutboxItems, descUncertainOldest, descQuarantined, descLastItemID,
	descInboxPending, descInboxDead, descInboxHighest, descInboxOldest, descReconOpen, descReconOldest,
	descEventsUndispatched, descEventsDead, descEventsConsumerDead, descEventsConsumerLag, descCountCap}

// Collector exports a Reader's Snapshot at scrape time. When the
// measurement fails it emits an invalid metric instead of any sample, so a
// registry served by ops.Handler answers 500 and Prometheus records the
// scrape as failed (`up == 0`): a figure it could not measure is never a 0.
// The cause goes to the log only (it may name the database host).
type Collector struct {
	r   *Reader
	log *slog.Logger
}

// NewCollector returns a Collector over r logging failures to log (nil:
// slog.Default()).
func NewCollector(r *Reader, log *slog.Logger) *Collector {
	if log == nil {
		log = slog.Default()
	}
	return &Collector{r: r, log: log}
}

// Describe sends every gauge's description.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range allDescs {
		ch <- d
	}
}

// Collect measures (or reuses a measurement younger than
// Config.MinIntervalMS) and sends every gauge.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	s, err := c.r.Cached(context.Background())
	if err != nil {
		c.log.Warn("gauges: measurement failed; scrape fails", "err", err)
		ch <- prometheus.NewInvalidMetric(descOutboxItems, err)
		return
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	for _, st := range BacklogStates {
		gauge(descBacklogAge, s.Outbox.BacklogAgeSeconds[st], string(st))
	}
	for _, st := range CountedStates {
		gauge(descOutboxItems, float64(s.Outbox.Items[st]), string(st))
	}
	gauge(descUncertainOldest, s.Outbox.UncertainOldestAgeSeconds)
	for reason, n := range s.Outbox.QuarantinedByReason {
		gauge(descQuarantined, float64(n), reason)
	}
	gauge(descLastItemID, float64(s.Outbox.LastItemID))
	gauge(descInboxPending, float64(s.Inbox.Pending))
	for reason, n := range s.Inbox.DeadLetters {
		gauge(descInboxDead, float64(n), reason)
	}
	gauge(descInboxHighest, float64(s.Inbox.HighestPendingAttempts))
	gauge(descInboxOldest, s.Inbox.OldestPendingAgeSeconds)
	for kind, n := range s.Reconciliation.OpenByKind {
		gauge(descReconOpen, float64(n), kind)
	}
	for kind, age := range s.Reconciliation.OldestOpenAgeSecondsByKind {
		gauge(descReconOldest, age, kind)
	}
	gauge(descEventsUndispatched, s.Events.UndispatchedOldestAgeSeconds)
	gauge(descEventsDead, float64(s.Events.OutboxDeadLetters))
	for consumer, n := range s.Events.ConsumerDeadLetters {
		gauge(descEventsConsumerDead, float64(n), consumer)
	}
	for consumer, age := range s.Events.ConsumerLagSeconds {
		gauge(descEventsConsumerLag, age, consumer)
	}
	gauge(descCountCap, float64(s.CountCap))
}
