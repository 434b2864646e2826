package relay

import "errors"

var (
	// ErrStreamConfig: the AURORA_OUTBOX stream exists with settings
	// JetStream refuses to update (or the server refused the configuration).
	// Not retried: an operator must fix the stream or the knobs.
	ErrStreamConfig = errors.New("relay: stream configuration refused")
	// ErrPublishTimeout: no PubAck arrived within AURORA_RELAY_PUBLISH_TIMEOUT_MS.
	// The row stays unpublished and is published again (same dispatch, so
	// JetStream drops the copy if the first one did arrive).
	ErrPublishTimeout = errors.New("relay: no PubAck within the publish timeout")
	// ErrNATSUnavailable: the NATS connection is not up; the worker backs
	// off without claiming rows until it reconnects.
	ErrNATSUnavailable = errors.New("relay: NATS connection not established")
	// ErrAlreadyRun: Run was called a second time on the same Relay.
	ErrAlreadyRun = errors.New("relay: Run called twice")
	// ErrForeignStream: the AURORA_OUTBOX stream belongs to another outbox
	// database (its metadata names it); the relay refuses to publish into
	// it. Each deployment needs its own NATS (or JetStream domain).
	ErrForeignStream = errors.New("relay: stream belongs to another outbox database")
	// ErrNilDependency: New was given a nil pool or JetStream context.
	ErrNilDependency = errors.New("relay: nil dependency")
)
