// Package relay publishes committed outbox rows to JetStream: the transport
// half of "Postgres is the truth, JetStream is the transport"
// (the relay never decides delivery; issue 3).
//
// Invariants it keeps:
//
//   - Nothing committed is skipped. Rows are selected by what they are —
//     due (pending with next_attempt_at <= now, or leased with an expired
//     lease) and published_dispatch < dispatch — never by a "last id"
//     cursor, which skips rows whose transactions commit out of id order.
//   - A row is marked published only after JetStream acknowledged its
//     dispatch's message (a duplicate PubAck included), in the transaction
//     that locked it (FOR UPDATE SKIP LOCKED). Holding the lock through the
//     publish keeps any other relay from publishing the same dispatch.
//   - The same dispatch always carries the same Nats-Msg-Id
//     (outbox.MsgID(key, dispatch)), so a republish after a crash or a lost
//     PubAck is dropped by JetStream's duplicate window; a later dispatch is
//     a new id and is never dropped.
//   - A message can be lost after its PubAck (the file store syncs every
//     2 minutes; a stream can be purged): a row still due and unclaimed
//     RedispatchSeconds after its publication gets dispatch+1 and is
//     published again, so nothing waits forever on a message that is gone.
//   - Time is the database's ("now" is coalesce($n::timestamptz, now()) with
//     the clock.Clock override), so replicas agree and tests use
//     clock.Manual instead of sleeping.
//   - Outages of Postgres or NATS are waited out with backoff; Run ends only
//     on its context or on a stream configuration JetStream refuses.
//
// Use New and Run (see docs/relay.md); EnsureStream creates the
// AURORA_OUTBOX stream for anyone who needs it before a relay runs.
package relay
