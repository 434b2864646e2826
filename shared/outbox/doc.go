// Package outbox is the export outbox of seed 000: the seven states, the
// quarantine reasons, the item row, and Stage, which writes an export intent
// in the caller's transaction.
//
// Invariants kept here and in the schema (migrations/sql/00001):
//   - the seven-part identity is unique; staging the same identity again
//     collapses onto the existing row;
//   - identity and payload are immutable once written (a database trigger);
//   - the idempotency key is a pure function of the identity (identity.Key),
//     recomputed by the database on insert;
//   - every transition out of leased is fenced by lease_token; zero rows is
//     ErrStaleLease, never retried.
package outbox
