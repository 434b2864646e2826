package events

import (
	"errors"
	"time"

	"github.com/aurora-billing/aurora/shared/config"
)

// Defaults of the knobs (AURORA_EVENTS_*). The consumer's interval and
// batch are seed 004's event_consumer_interval_ms and @catch_up_limit.
const (
	ConsumerIntervalDefault      = 5 * time.Second
	CatchUpLimitDefault          = 200
	ConsumerMaxAttemptsDefault   = 5
	ConsumerBackoffBaseDefault   = time.Second
	ConsumerBackoffCapDefault    = 5 * time.Minute
	ConsumerAckWaitDefault       = 30 * time.Second
	ConsumerMaxDeliverDefault    = 20
	DispatchBatchSizeDefault     = 100
	DispatchPollDefault          = time.Second
	DispatchLeaseDefault         = 30 * time.Second
	DispatchMaxAttemptsDefault   = 10
	DispatchBackoffBaseDefault   = 500 * time.Millisecond
	DispatchBackoffCapDefault    = time.Minute
	PublishTimeoutDefault        = 5 * time.Second
	StreamReplicasDefault        = 1
	StreamMaxAgeDefault          = 72 * time.Hour
	DuplicateWindowDefault       = 2 * time.Minute
	RetentionDefault             = 168 * time.Hour
	RetentionScanIntervalDefault = time.Hour
)

// Config holds every domain-event knob: a consumer's (ConsumerConfig) and
// the dispatcher's, the stream's and retention's (DispatcherConfig), which
// a consumer reads too (it ensures the stream). Load it with config.Load
// (prefix AURORA_) or start from DefaultConfig. A process that only
// dispatches (aurora relay) loads a DispatcherConfig and reads no
// AURORA_EVENTS_CONSUMER_* variable.
type Config struct {
	ConsumerConfig
	DispatcherConfig
}

// ConsumerConfig holds the knobs only a consumer (Client.Consume) reads:
// AURORA_EVENTS_CONSUMER_* and AURORA_EVENTS_CATCH_UP_LIMIT.
type ConsumerConfig struct {
	// ConsumerIntervalMS: the catch-up loop's period (seed 004's
	// event_consumer_interval_ms). AURORA_EVENTS_CONSUMER_INTERVAL_MS,
	// default 5000, 100..600000.
	ConsumerIntervalMS int `env:"EVENTS_CONSUMER_INTERVAL_MS" envDefault:"5000"`
	// CatchUpLimit: dispatched events one catch-up pass fetches (seed 004's
	// @catch_up_limit). AURORA_EVENTS_CATCH_UP_LIMIT, default 200, 1..10000.
	CatchUpLimit int `env:"EVENTS_CATCH_UP_LIMIT" envDefault:"200"`
	// ConsumerMaxAttempts: handler failures after which an event is
	// dead-lettered for that consumer. AURORA_EVENTS_CONSUMER_MAX_ATTEMPTS,
	// default 5, 1..100.
	ConsumerMaxAttempts int `env:"EVENTS_CONSUMER_MAX_ATTEMPTS" envDefault:"5"`
	// ConsumerBackoffBaseMS, ConsumerBackoffCapMS: after the n-th failure
	// the event is retried after min(cap, base·2^(n-1)).
	// AURORA_EVENTS_CONSUMER_BACKOFF_BASE_MS default 1000, 10..600000;
	// AURORA_EVENTS_CONSUMER_BACKOFF_CAP_MS default 300000, 10..86400000
	// and at least the base.
	ConsumerBackoffBaseMS int `env:"EVENTS_CONSUMER_BACKOFF_BASE_MS" envDefault:"1000"`
	ConsumerBackoffCapMS  int `env:"EVENTS_CONSUMER_BACKOFF_CAP_MS" envDefault:"300000"`
	// ConsumerAckWaitSeconds: the durable JetStream consumer's AckWait; the
	// handler heartbeats (InProgress) while it runs.
	// AURORA_EVENTS_CONSUMER_ACK_WAIT_SECONDS, default 30, 1..3600.
	ConsumerAckWaitSeconds int `env:"EVENTS_CONSUMER_ACK_WAIT_SECONDS" envDefault:"30"`
	// ConsumerMaxDeliver: the durable consumer's MaxDeliver, the backstop
	// for a handler that kills its process before it can record a failure;
	// JetStream's MAX_DELIVERIES advisory then dead-letters the event
	// (ReasonMaxDeliveries). AURORA_EVENTS_CONSUMER_MAX_DELIVER, default 20,
	// 2..1000 and more than ConsumerMaxAttempts.
	ConsumerMaxDeliver int `env:"EVENTS_CONSUMER_MAX_DELIVER" envDefault:"20"`
}

// DispatcherConfig holds the knobs the dispatcher reads (AURORA_EVENTS_
// DISPATCH_*, the publish timeout, the stream's and retention's); a
// consumer reads the stream's too.
type DispatcherConfig struct {
	// DispatchBatchSize: events claimed and published per transaction.
	// AURORA_EVENTS_DISPATCH_BATCH_SIZE, default 100, 1..1000.
	DispatchBatchSize int `env:"EVENTS_DISPATCH_BATCH_SIZE" envDefault:"100"`
	// DispatchPollMS: polling fallback when no NOTIFY arrives.
	// AURORA_EVENTS_DISPATCH_POLL_MS, default 1000, 10..60000.
	DispatchPollMS int `env:"EVENTS_DISPATCH_POLL_MS" envDefault:"1000"`
	// DispatchLeaseSeconds: how long a dispatching row is reserved for the
	// dispatcher publishing it. AURORA_EVENTS_DISPATCH_LEASE_SECONDS,
	// default 30, 5..3600, and more than the publish timeout.
	DispatchLeaseSeconds int `env:"EVENTS_DISPATCH_LEASE_SECONDS" envDefault:"30"`
	// DispatchMaxAttempts: failed publishes after which the row is
	// dead_letter. AURORA_EVENTS_DISPATCH_MAX_ATTEMPTS, default 10, 1..1000.
	DispatchMaxAttempts int `env:"EVENTS_DISPATCH_MAX_ATTEMPTS" envDefault:"10"`
	// DispatchBackoffBaseMS, DispatchBackoffCapMS: a failed publish is
	// retried after min(cap, base·2^(attempts-1)).
	// AURORA_EVENTS_DISPATCH_BACKOFF_BASE_MS default 500, 10..600000;
	// AURORA_EVENTS_DISPATCH_BACKOFF_CAP_MS default 60000, 10..86400000
	// and at least the base.
	DispatchBackoffBaseMS int `env:"EVENTS_DISPATCH_BACKOFF_BASE_MS" envDefault:"500"`
	DispatchBackoffCapMS  int `env:"EVENTS_DISPATCH_BACKOFF_CAP_MS" envDefault:"60000"`
	// PublishTimeoutMS: how long a batch waits for its PubAcks.
	// AURORA_EVENTS_PUBLISH_TIMEOUT_MS, default 5000, 100..60000.
	PublishTimeoutMS int `env:"EVENTS_PUBLISH_TIMEOUT_MS" envDefault:"5000"`

	// StreamReplicas: AURORA_EVENTS_STREAM_REPLICAS, default 1, 1..5.
	StreamReplicas int `env:"EVENTS_STREAM_REPLICAS" envDefault:"1"`
	// StreamMaxAgeHours: how long AURORA_EVENTS keeps a message (limits
	// retention, so every consumer reads it on its own position).
	// AURORA_EVENTS_STREAM_MAX_AGE_HOURS, default 72, 1..8760.
	StreamMaxAgeHours int `env:"EVENTS_STREAM_MAX_AGE_HOURS" envDefault:"72"`
	// DuplicateWindowSeconds: how long JetStream remembers a Nats-Msg-Id.
	// AURORA_EVENTS_DUPLICATE_WINDOW_SECONDS, default 120, 10..86400 and at
	// most the stream's max age.
	DuplicateWindowSeconds int `env:"EVENTS_DUPLICATE_WINDOW_SECONDS" envDefault:"120"`

	// RetentionHours: how long an acknowledged event and its inbox rows are
	// kept before Purge deletes them. It must exceed the stream's max age
	// (a message still in the stream can be redelivered, and its inbox row
	// is what makes that a duplicate). AURORA_EVENTS_RETENTION_HOURS,
	// default 168, 1..87600 and more than AURORA_EVENTS_STREAM_MAX_AGE_HOURS.
	RetentionHours int `env:"EVENTS_RETENTION_HOURS" envDefault:"168"`
	// RetentionScanSeconds: how often the dispatcher runs Purge; 0 turns
	// the purge off. AURORA_EVENTS_RETENTION_SCAN_SECONDS, default 3600,
	// 0..86400.
	RetentionScanSeconds int `env:"EVENTS_RETENTION_SCAN_SECONDS" envDefault:"3600"`
}

// DefaultConfig returns the documented defaults (what config.Load yields
// with no AURORA_EVENTS_* variable set).
func DefaultConfig() Config {
	ms := func(d time.Duration) int { return int(d / time.Millisecond) }
	return Config{
		ConsumerConfig: ConsumerConfig{
			ConsumerIntervalMS:     ms(ConsumerIntervalDefault),
			CatchUpLimit:           CatchUpLimitDefault,
			ConsumerMaxAttempts:    ConsumerMaxAttemptsDefault,
			ConsumerBackoffBaseMS:  ms(ConsumerBackoffBaseDefault),
			ConsumerBackoffCapMS:   ms(ConsumerBackoffCapDefault),
			ConsumerAckWaitSeconds: int(ConsumerAckWaitDefault / time.Second),
			ConsumerMaxDeliver:     ConsumerMaxDeliverDefault,
		},
		DispatcherConfig: DispatcherConfig{
			DispatchBatchSize:      DispatchBatchSizeDefault,
			DispatchPollMS:         ms(DispatchPollDefault),
			DispatchLeaseSeconds:   int(DispatchLeaseDefault / time.Second),
			DispatchMaxAttempts:    DispatchMaxAttemptsDefault,
			DispatchBackoffBaseMS:  ms(DispatchBackoffBaseDefault),
			DispatchBackoffCapMS:   ms(DispatchBackoffCapDefault),
			PublishTimeoutMS:       ms(PublishTimeoutDefault),
			StreamReplicas:         StreamReplicasDefault,
			StreamMaxAgeHours:      int(StreamMaxAgeDefault / time.Hour),
			DuplicateWindowSeconds: int(DuplicateWindowDefault / time.Second),
			RetentionHours:         int(RetentionDefault / time.Hour),
			RetentionScanSeconds:   int(RetentionScanIntervalDefault / time.Second),
		},
	}
}

// Config returns c with the consumers' defaults beside it: what
// NewDispatcher takes from a process that loaded only the dispatcher's
// knobs (the dispatcher reads none of the consumers').
func (c DispatcherConfig) Config() Config {
	return Config{ConsumerConfig: DefaultConfig().ConsumerConfig, DispatcherConfig: c}
}

// Validate returns every out-of-range knob as a *config.RangeError
// (config.ErrInvalid), joined.
func (c Config) Validate() error {
	return errors.Join(c.ConsumerConfig.Validate(), c.DispatcherConfig.Validate())
}

// Validate returns every out-of-range consumer knob as a
// *config.RangeError (config.ErrInvalid), joined.
func (c ConsumerConfig) Validate() error {
	// Relations are judged only between values each in range (one mistake,
	// one error), and config.Load names the variable that was set.
	attempts := config.IntRange("EVENTS_CONSUMER_MAX_ATTEMPTS", c.ConsumerMaxAttempts, 1, 100, "attempts")
	base := config.IntRange("EVENTS_CONSUMER_BACKOFF_BASE_MS", c.ConsumerBackoffBaseMS, 10, 600000, "milliseconds")
	capErr := config.IntRange("EVENTS_CONSUMER_BACKOFF_CAP_MS", c.ConsumerBackoffCapMS, 10, 86400000, "milliseconds")
	if base == nil && capErr == nil {
		capErr = config.Relation("EVENTS_CONSUMER_BACKOFF_CAP_MS", c.ConsumerBackoffCapMS, ">=", "EVENTS_CONSUMER_BACKOFF_BASE_MS", c.ConsumerBackoffBaseMS,
			"the largest retry delay cannot be below the first")
	}
	deliver := config.IntRange("EVENTS_CONSUMER_MAX_DELIVER", c.ConsumerMaxDeliver, 2, 1000, "deliveries")
	if attempts == nil && deliver == nil {
		deliver = config.Relation("EVENTS_CONSUMER_MAX_DELIVER", c.ConsumerMaxDeliver, ">", "EVENTS_CONSUMER_MAX_ATTEMPTS", c.ConsumerMaxAttempts,
			"JetStream must redeliver the last attempt's failure")
	}
	return errors.Join(
		config.IntRange("EVENTS_CONSUMER_INTERVAL_MS", c.ConsumerIntervalMS, 100, 600000, "milliseconds"),
		config.IntRange("EVENTS_CATCH_UP_LIMIT", c.CatchUpLimit, 1, 10000, "events"),
		attempts, base, capErr,
		config.IntRange("EVENTS_CONSUMER_ACK_WAIT_SECONDS", c.ConsumerAckWaitSeconds, 1, 3600, "seconds"),
		deliver,
	)
}

// Validate returns every out-of-range dispatcher, stream or retention knob
// as a *config.RangeError (config.ErrInvalid), joined.
func (c DispatcherConfig) Validate() error {
	// Relations are judged only between values each in range (one mistake,
	// one error), and config.Load names the variable that was set.
	publish := config.IntRange("EVENTS_PUBLISH_TIMEOUT_MS", c.PublishTimeoutMS, 100, 60000, "milliseconds")
	lease := config.IntRange("EVENTS_DISPATCH_LEASE_SECONDS", c.DispatchLeaseSeconds, 5, 3600, "seconds")
	if publish == nil && lease == nil {
		lease = config.RelationBound("EVENTS_DISPATCH_LEASE_SECONDS", c.DispatchLeaseSeconds, ">=", c.PublishTimeoutMS/1000+1,
			config.Prefix+"EVENTS_PUBLISH_TIMEOUT_MS / 1000 + 1", "EVENTS_PUBLISH_TIMEOUT_MS", c.PublishTimeoutMS,
			"a publish must end within the dispatcher's lease")
	}
	base := config.IntRange("EVENTS_DISPATCH_BACKOFF_BASE_MS", c.DispatchBackoffBaseMS, 10, 600000, "milliseconds")
	capErr := config.IntRange("EVENTS_DISPATCH_BACKOFF_CAP_MS", c.DispatchBackoffCapMS, 10, 86400000, "milliseconds")
	if base == nil && capErr == nil {
		capErr = config.Relation("EVENTS_DISPATCH_BACKOFF_CAP_MS", c.DispatchBackoffCapMS, ">=", "EVENTS_DISPATCH_BACKOFF_BASE_MS", c.DispatchBackoffBaseMS,
			"the largest retry delay cannot be below the first")
	}
	maxAge := config.IntRange("EVENTS_STREAM_MAX_AGE_HOURS", c.StreamMaxAgeHours, 1, 8760, "hours")
	window := config.IntRange("EVENTS_DUPLICATE_WINDOW_SECONDS", c.DuplicateWindowSeconds, 10, 86400, "seconds")
	retention := config.IntRange("EVENTS_RETENTION_HOURS", c.RetentionHours, 2, 87600, "hours")
	if maxAge == nil && window == nil {
		window = config.RelationBound("EVENTS_DUPLICATE_WINDOW_SECONDS", c.DuplicateWindowSeconds, "<=", c.StreamMaxAgeHours*3600,
			config.Prefix+"EVENTS_STREAM_MAX_AGE_HOURS × 3600", "EVENTS_STREAM_MAX_AGE_HOURS", c.StreamMaxAgeHours,
			"JetStream refuses a duplicate window longer than the stream keeps messages")
	}
	if maxAge == nil && retention == nil {
		retention = config.Relation("EVENTS_RETENTION_HOURS", c.RetentionHours, ">", "EVENTS_STREAM_MAX_AGE_HOURS", c.StreamMaxAgeHours,
			"an event row must outlive its message in the stream")
	}
	return errors.Join(
		config.IntRange("EVENTS_DISPATCH_BATCH_SIZE", c.DispatchBatchSize, 1, 1000, "events"),
		config.IntRange("EVENTS_DISPATCH_POLL_MS", c.DispatchPollMS, 10, 60000, "milliseconds"),
		lease,
		config.IntRange("EVENTS_DISPATCH_MAX_ATTEMPTS", c.DispatchMaxAttempts, 1, 1000, "attempts"),
		base, capErr, publish,
		config.IntRange("EVENTS_STREAM_REPLICAS", c.StreamReplicas, 1, 5, "replicas"),
		maxAge, window, retention,
		config.IntRange("EVENTS_RETENTION_SCAN_SECONDS", c.RetentionScanSeconds, 0, 86400, "seconds, 0 = off"),
	)
}

func msDur(ms int) time.Duration { return time.Duration(ms) * time.Millisecond }

func (c Config) consumerInterval() time.Duration { return msDur(c.ConsumerIntervalMS) }
func (c Config) ackWait() time.Duration          { return time.Duration(c.ConsumerAckWaitSeconds) * time.Second }
func (c Config) dispatchPoll() time.Duration     { return msDur(c.DispatchPollMS) }
func (c Config) dispatchLease() time.Duration {
	return time.Duration(c.DispatchLeaseSeconds) * time.Second
}
func (c Config) publishTimeout() time.Duration { return msDur(c.PublishTimeoutMS) }
func (c Config) streamMaxAge() time.Duration   { return time.Duration(c.StreamMaxAgeHours) * time.Hour }
func (c Config) retention() time.Duration      { return time.Duration(c.RetentionHours) * time.Hour }

// backoff returns min(cap, base·2^(n-1)) for the n-th failure (n ≥ 1).
func backoff(baseMS, capMS, n int) time.Duration {
	d := msDur(baseMS)
	limit := msDur(capMS)
	for i := 1; i < n && d < limit; i++ {
		d *= 2
	}
	return min(d, limit)
}
