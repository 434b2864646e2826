package events

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

type dispatchMetrics struct {
	published       prometheus.Counter
	publishFailures prometheus.Counter
	deadLetters     prometheus.Counter
	batchErrors     prometheus.Counter
	purged          prometheus.Counter
}

func newDispatchMetrics() *dispatchMetrics {
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "aurora", Subsystem: "events", Name: name, Help: help})
	}
	return &dispatchMetrics{
		published:       c("published_total", "Events JetStream acknowledged (rows marked dispatched)."),
		publishFailures: c("publish_failures_total", "Event publishes that failed (row marked failed or dead_letter)."),
		deadLetters:     c("dispatch_dead_letters_total", "Events dead-lettered after AURORA_EVENTS_DISPATCH_MAX_ATTEMPTS failed publishes."),
		batchErrors:     c("dispatch_batch_errors_total", "Dispatch batches that failed on Postgres or NATS (retried with backoff)."),
		purged:          c("purged_total", "Acknowledged events deleted by the retention purge (with their inbox rows)."),
	}
}

func (m *dispatchMetrics) register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.published, m.publishFailures, m.deadLetters, m.batchErrors, m.purged} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("events: register metrics: %w", err)
		}
	}
	return nil
}

// consumerMetrics are labelled by consumer name.
type consumerMetrics struct {
	processed   *prometheus.CounterVec // consumer, source
	duplicates  *prometheus.CounterVec // consumer, source
	failures    *prometheus.CounterVec // consumer, stage (claim|handler)
	deadLetters *prometheus.CounterVec // consumer, reason
	lag         *prometheus.GaugeVec   // consumer
}

func newConsumerMetrics() *consumerMetrics {
	return &consumerMetrics{
		processed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "aurora", Subsystem: "events_consumer", Name: "processed_total",
			Help: "Events a consumer's handler processed (committed with its inbox row), by path."}, []string{"consumer", "source"}),
		duplicates: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "aurora", Subsystem: "events_consumer", Name: "duplicates_total",
			Help: "Deliveries skipped because the consumer's inbox already holds the event."}, []string{"consumer", "source"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "aurora", Subsystem: "events_consumer", Name: "failures_total",
			Help: "Failed attempts: stage=handler (recorded on the inbox row, retried) or stage=claim (the claim itself failed)."}, []string{"consumer", "stage"}),
		deadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "aurora", Subsystem: "events_consumer", Name: "dead_letters_total",
			Help: "Events dead-lettered for a consumer, by reason."}, []string{"consumer", "reason"}),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "aurora", Subsystem: "events_consumer", Name: "catch_up_lag_seconds",
			Help: "Age of the oldest dispatched event the consumer has neither processed nor dead-lettered, at the last catch-up pass (0 when none)."}, []string{"consumer"}),
	}
}

func (m *consumerMetrics) register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.processed, m.duplicates, m.failures, m.deadLetters, m.lag} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("events: register metrics: %w", err)
		}
	}
	return nil
}
