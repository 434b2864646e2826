package relay

import (
	"errors"
	"time"

	"github.com/aurora-billing/aurora/shared/config"
	"github.com/aurora-billing/aurora/shared/outbox"
)

// Defaults of the relay's knobs (AURORA_RELAY_*, AURORA_OUTBOX_STREAM_*).
const (
	// PollDefault is the polling fallback interval when no NOTIFY arrives:
	// 1000 ms. Rows that become due later (a retry's next_attempt_at) are
	// found by polling, since nothing NOTIFYs when time passes.
	PollDefault = time.Second
	// RedispatchDefault is how long a published row may stay due and
	// unclaimed (since both its publication and its becoming due) before its
	// message is presumed lost and it is dispatched again: 300 s. It must exceed the deliverers' normal lag, or a healthy
	// backlog is published twice (harmless, wasteful).
	RedispatchDefault = 300 * time.Second
	// RedispatchScanDefault is how often the re-dispatch sweep runs: 5000 ms.
	RedispatchScanDefault = 5 * time.Second
	// MaxInflightDefault bounds unacknowledged async publishes across all
	// workers: 1000 messages.
	MaxInflightDefault = 1000
	// WorkersDefault is the number of concurrent batch workers: 4.
	WorkersDefault = 4
	// PublishTimeoutDefault is how long a batch waits for its PubAcks: 5000 ms.
	PublishTimeoutDefault = 5 * time.Second
	// StreamReplicasDefault is the AURORA_OUTBOX stream's replica count: 1.
	StreamReplicasDefault = 1
	// DuplicateWindowDefault is the stream's Nats-Msg-Id duplicate window:
	// 120 s (JetStream's own default).
	DuplicateWindowDefault = 2 * time.Minute
)

// Config holds the relay's knobs. Load it with config.Load (prefix AURORA_);
// the zero value is not valid, use DefaultConfig or config.Load.
type Config struct {
	// Outbox carries AURORA_OUTBOX_BATCH_SIZE (rows claimed and published
	// per transaction; default 100, 1..1000) and the other outbox knobs,
	// validated together so every service agrees on them.
	Outbox config.Outbox
	// PollMS: polling fallback interval in milliseconds.
	// AURORA_RELAY_POLL_MS, default 1000, 10..60000.
	PollMS int `env:"RELAY_POLL_MS" envDefault:"1000"`
	// RedispatchSeconds: a row published for its dispatch this many seconds
	// ago, due for this long and still unclaimed gets dispatch+1 and is
	// published again (its message is presumed lost).
	// AURORA_RELAY_REDISPATCH_SECONDS, default 300, 5..86400.
	RedispatchSeconds int `env:"RELAY_REDISPATCH_SECONDS" envDefault:"300"`
	// RedispatchScanMS: how often the re-dispatch sweep looks for such rows,
	// in milliseconds. AURORA_RELAY_REDISPATCH_SCAN_MS, default 5000,
	// 10..600000.
	RedispatchScanMS int `env:"RELAY_REDISPATCH_SCAN_MS" envDefault:"5000"`
	// MaxInflight: async publishes awaiting their PubAck, across all workers.
	// AURORA_RELAY_MAX_INFLIGHT, default 1000, 1..10000. The JetStream
	// context must allow at least as many (jetstream.WithPublishAsyncMaxPending).
	MaxInflight int `env:"RELAY_MAX_INFLIGHT" envDefault:"1000"`
	// Workers: concurrent batch workers (each holds one Postgres connection
	// while it works). AURORA_RELAY_WORKERS, default 4, 1..64.
	Workers int `env:"RELAY_WORKERS" envDefault:"4"`
	// PublishTimeoutMS: how long a batch waits for its PubAcks before the
	// unacknowledged rows are left unpublished for the next batch, in
	// milliseconds. AURORA_RELAY_PUBLISH_TIMEOUT_MS, default 5000, 100..60000.
	PublishTimeoutMS int `env:"RELAY_PUBLISH_TIMEOUT_MS" envDefault:"5000"`
	// BatchMessageItems: the most items one JetStream message carries. 1
	// (the default) publishes one message per item. Above 1, a batch's due
	// items of one exporter and partition go out as batch messages
	// (outbox.Batch on outbox.BatchSubject) of up to this many items — but
	// only to a subject a partition consumer whose deliverers accept
	// batches filters (outbox.MetaBatchMessages, re-read every
	// batchSubjectsTTL), at most one item of a lane a message; every other
	// item is still published alone. It helps load spread over many lanes
	// and hurts a few hot ones under faults (docs/relay.md has the figures).
	// AURORA_RELAY_BATCH_MESSAGE_ITEMS, default 1, 1..1000.
	BatchMessageItems int `env:"RELAY_BATCH_MESSAGE_ITEMS" envDefault:"1"`
	// Stream configures the AURORA_OUTBOX stream.
	Stream StreamConfig
}

// StreamConfig configures the AURORA_OUTBOX stream that EnsureStream creates
// or updates. Retention (work queue), storage (file) and subjects
// (aurora.outbox.>) are fixed by the contract in shared/outbox.
type StreamConfig struct {
	// Replicas: AURORA_OUTBOX_STREAM_REPLICAS, default 1, 1..5 (a cluster
	// needs at least that many JetStream servers).
	Replicas int `env:"OUTBOX_STREAM_REPLICAS" envDefault:"1"`
	// DuplicateWindowSeconds: how long JetStream remembers a Nats-Msg-Id, so
	// a relay's republish of the same dispatch is dropped.
	// AURORA_OUTBOX_DUPLICATE_WINDOW_SECONDS, default 120, 10..86400.
	DuplicateWindowSeconds int `env:"OUTBOX_DUPLICATE_WINDOW_SECONDS" envDefault:"120"`
	// Partitions: how many partitions the lanes are spread over (each
	// consumed by one deliverer at a time); written into the stream's
	// metadata, where the deliverers read it. Changing it needs an empty
	// stream. AURORA_OUTBOX_PARTITIONS, default 16, 1..1024.
	Partitions int `env:"OUTBOX_PARTITIONS" envDefault:"16"`
	// Database is the outbox.DatabaseID the stream belongs to, written
	// into its metadata (not a variable: Run sets it from the pool). Empty
	// leaves the stream's recorded database as it is.
	Database string `env:"-"`
}

// DefaultConfig returns the documented defaults (the same values config.Load
// yields with no AURORA_* variables set).
func DefaultConfig() Config {
	return Config{
		Outbox: config.Outbox{
			LeaseSeconds: 120, MaxAttempts: 20, BatchSize: 100,
			BackoffBaseSeconds: 5, BackoffCapSeconds: 900, UncertaintyHorizonSeconds: 82800,
		},
		PollMS:            int(PollDefault / time.Millisecond),
		RedispatchSeconds: int(RedispatchDefault / time.Second),
		RedispatchScanMS:  int(RedispatchScanDefault / time.Millisecond),
		MaxInflight:       MaxInflightDefault,
		Workers:           WorkersDefault,
		PublishTimeoutMS:  int(PublishTimeoutDefault / time.Millisecond),
		BatchMessageItems: 1,
		Stream:            DefaultStreamConfig(),
	}
}

// DefaultStreamConfig returns the stream defaults: 1 replica, 120 s
// duplicate window, 16 partitions.
func DefaultStreamConfig() StreamConfig {
	return StreamConfig{Replicas: StreamReplicasDefault, DuplicateWindowSeconds: int(DuplicateWindowDefault / time.Second),
		Partitions: outbox.PartitionsDefault}
}

// Validate returns every out-of-range knob as a *config.RangeError (wrapping
// config.ErrInvalid), joined.
func (c Config) Validate() error {
	return errors.Join(
		c.Outbox.Validate(),
		config.IntRange("RELAY_POLL_MS", c.PollMS, 10, 60000, "milliseconds"),
		config.IntRange("RELAY_REDISPATCH_SECONDS", c.RedispatchSeconds, 5, 86400, "seconds"),
		config.IntRange("RELAY_REDISPATCH_SCAN_MS", c.RedispatchScanMS, 10, 600000, "milliseconds"),
		config.IntRange("RELAY_MAX_INFLIGHT", c.MaxInflight, 1, 10000, "messages"),
		config.IntRange("RELAY_WORKERS", c.Workers, 1, 64, "workers"),
		config.IntRange("RELAY_PUBLISH_TIMEOUT_MS", c.PublishTimeoutMS, 100, 60000, "milliseconds"),
		config.IntRange("RELAY_BATCH_MESSAGE_ITEMS", c.BatchMessageItems, 1, 1000, "items"),
		c.Stream.Validate(),
	)
}

// Validate checks the stream knobs' ranges.
func (s StreamConfig) Validate() error {
	return errors.Join(
		config.IntRange("OUTBOX_STREAM_REPLICAS", s.Replicas, 1, 5, "replicas"),
		config.IntRange("OUTBOX_DUPLICATE_WINDOW_SECONDS", s.DuplicateWindowSeconds, 10, 86400, "seconds"),
		config.IntRange("OUTBOX_PARTITIONS", s.Partitions, 1, 1024, "partitions"),
	)
}

func (c Config) poll() time.Duration { return time.Duration(c.PollMS) * time.Millisecond }
func (c Config) redispatch() time.Duration {
	return time.Duration(c.RedispatchSeconds) * time.Second
}
func (c Config) redispatchScan() time.Duration {
	return time.Duration(c.RedispatchScanMS) * time.Millisecond
}
func (c Config) publishTimeout() time.Duration {
	return time.Duration(c.PublishTimeoutMS) * time.Millisecond
}
