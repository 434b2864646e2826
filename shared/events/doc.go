// Package events carries domain events between an application's services
// with at-least-once delivery and exactly-once effects: a transactional
// outbox on the producer side, a dedupe inbox on the consumer side, and
// JetStream (stream AURORA_EVENTS) in between.
//
// Producer: Publish (or Queue, for a pgx.Batch) inserts one event_outbox row
// in the caller's transaction, so the event commits or rolls back with the
// change it announces.
//
// Dispatch: a Dispatcher (run by `aurora relay` beside the export relay)
// claims committed, due rows with FOR UPDATE SKIP LOCKED, publishes each to
// aurora.events.<Type> with Nats-Msg-Id = the event id (JetStream drops a
// republish inside the duplicate window), and marks it dispatched after the
// PubAck. A failed publish is retried with backoff and ends dead_letter after
// AURORA_EVENTS_DISPATCH_MAX_ATTEMPTS.
//
// Consumer: Client.Consume registers the consumer for its event types and
// processes each event twice over, safely: real-time from a durable
// JetStream consumer, and from the catch-up loop that lists the dispatched
// events the consumer has not processed every AURORA_EVENTS_CONSUMER_INTERVAL_MS
// (seed 004's event_consumer_interval_ms, default 5,000; at most
// AURORA_EVENTS_CATCH_UP_LIMIT, default 200, per pass). The handler runs in
// one transaction with the inbox claim, an INSERT of (consumer, event_id):
// a unique violation on event_inbox_pkey is a duplicate (skipped silently);
// any other error is an error, retried and counted, never "new" and never
// "duplicate".
//
// Invariants: the outbox row becomes acknowledged only when every consumer
// registered for its type has a processed inbox row; a handler that keeps
// failing is dead-lettered for that consumer after
// AURORA_EVENTS_CONSUMER_MAX_ATTEMPTS and stops being fetched, so it never
// starves the events behind it; nothing is ever deleted while it could
// still be delivered or replayed (Purge).
//
// docs/events.md states the protocol, the states and the knobs.
package events
