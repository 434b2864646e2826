// Package deliverer is the stateless consumer of seed 000's export outbox:
// for each JetStream message it claims the named row in Postgres with a fenced
// lease, runs the pre-send checks, calls the provider through an Exporter with
// the item's idempotency key, records the outcome fenced by lease_token, and
// acknowledges the message.
//
// Invariants kept here:
//   - Who gets an item is decided by FOR UPDATE SKIP LOCKED in the claim;
//     whose write wins is decided by lease_token. Every transition out of
//     leased carries state = 'leased' AND lease_token = $n; zero rows is
//     outbox.ErrStaleLease: counted, logged, never retried, never a panic.
//   - lease_expires_at, next_attempt_at and the horizon are compared against
//     the database clock (clock.Clock; clock.Manual in tests).
//   - Every attempt sends the same key, as Stripe's Idempotency-Key and as the
//     meter event identifier; the request body is a pure function of the row
//     and its mapping, so a retry is byte-identical.
//   - At most one provider call is in flight per lane (destination account,
//     Stripe customer, meter): the relay publishes a lane on one partition,
//     JetStream pins each partition consumer to one deliverer (priority
//     group, pinned client), and that deliverer runs a lane one item at a
//     time. During a take-over an old owner's call may overlap the new
//     owner's: Stripe answers 429, retried with the same key.
//   - A message whose row is not claimable is acknowledged or delayed without
//     side effects; Postgres is the truth, JetStream only says "try now".
//   - Logs carry item ids and key prefixes, never payloads, customer ids or
//     API keys.
//
// The provider answer → outcome table lives next to the provider client
// (package stripeexport) and in docs/deliverer.md.
package deliverer
