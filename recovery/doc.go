// Package recovery is the operator's side of the export outbox (seed 000,
// "Quarantine" and "An uncertain item, and the person who resolves it"):
// find uncertain and quarantined items, inspect one (its attempts, its
// recovery actions, and the identifier to search for at Stripe), and resolve
// it deliberately:
//
//   - Acknowledge: uncertain → accepted (never confirmed: only the reconciler,
//     holding the provider's own evidence, says confirmed);
//   - Abandon: uncertain → rejected, clearing the staged link so the subject
//     restages under a new identity (a new idempotency key) — that restaging
//     is a send;
//   - Requeue: quarantined → pending, refused with mapping_changed when the
//     feature's mapping version moved since the item was built.
//
// Invariants kept here:
//   - every write states what the caller expects the row to be (Expected:
//     state, lease_token, subject_ref, and provider_ref where given); the row
//     is read FOR UPDATE and compared, and a mismatch is refused with
//     *ExpectedStateMismatchError carrying what the row says now, so a stale
//     screen cannot act on a row that has since moved;
//   - every call on an existing item, applied or refused, writes one
//     recovery_actions row (actor, action, reason, evidence, expected,
//     observed, applied, refusal); a refusal commits in a transaction that
//     changes nothing else;
//   - reason and evidence must be non-blank (ErrInvalidReason,
//     ErrInvalidEvidence); there is no force option anywhere;
//   - nothing here moves an item automatically: each transition is one
//     operator call.
//
// The asymmetry behind the discipline (seed 000): a wrong acknowledgement
// under-bills one window; a wrong abandonment double-bills, because the
// subject restages under a new identity and is sent again.
package recovery
