// Package inbox is the Stripe webhook inbox of seed 003: an HTTP endpoint
// that verifies, stores durably and only then answers 200, and a worker that
// projects customer linkage, subscriptions, invoices and entitlements under
// strict ordering and ambiguity rules.
//
// Endpoint (Handler, POST /webhooks/stripe): body ≤ MaxBodyBytes (512 KiB,
// else 413); Stripe-Signature checked with stripe-go's webhook package
// against every configured secret (rotation), SignatureTolerance 300 s into
// the past and FutureTolerance 300 s into the future (else 400, nothing
// stored); the raw body stored verbatim in billing_events under its unique
// event id, whatever its api_version; 200 only after the commit (a
// redelivery is 200 without a second row); any store failure is 503. Nothing
// else runs on the request path. Concurrent requests share commits
// (Store's group commit) but each is answered after its own row committed.
//
// Worker: each event in its own transaction on one pinned connection, the
// row locked FOR UPDATE SKIP LOCKED, then pg_try_advisory_xact_lock on its
// Stripe customer (held elsewhere → skipped this pass); the projection, the
// wakeups and processed_at commit together, or nothing does. Outcomes:
// processed (Outcome: applied, stale, unchanged, ignored), deferred within
// the 12-attempt budget (60 s … 1 h), or dead-lettered with a Reason.
//
// The rules (seed 003), each tested in worker_test.go:
//   - a subscription/invoice event before its customer's checkout is
//     deferred customer_not_linked (first by 60 s); the checkout's linkage
//     wakes the customer's pending rows at once and revives its
//     customer_not_linked dead letters with a fresh budget;
//   - deferrals customer_not_linked, subscription_not_linked,
//     unmapped_stripe_price, stripe_price_config_missing and failed SQL
//     projections share the budget; the twelfth attempt dead-letters;
//   - invalid stored events quarantine at once (unrecognized_stripe_payload);
//   - an invoice event whose amount_paid (paid) or amount_due (failed) is
//     present but not a non-negative integer, or whose currency is present
//     but not three letters, quarantines at once (invalid_invoice_amount)
//     instead of being announced without it;
//   - an older subscription event never overwrites a newer one; the same
//     second with a different state is ambiguous_subscription_order;
//   - invoice outcomes have their own per-invoice guard and a customer-level
//     guard; billing status comes from invoices only, so an earlier
//     subscription never undoes a later invoice status; an opposite outcome
//     in the same second is ambiguous_invoice_order;
//   - ambiguous_multi_subscription, ambiguous_invoice_subscription and
//     ambiguous_customer_linkage quarantine before any mutation;
//   - an identical linkage replay is unchanged; unknown event types are
//     processed with no projection.
//
// Operators read the seed's inventory and act on one dead letter at a time
// (ReadInventory, ListDeadLetters, Inspect, RequeueDeadLetter; auroractl
// inbox), resolve a same-second ambiguity from Stripe's current object
// (ReadAmbiguity, PlanResolution, ApplyResolution with a StripeProvider;
// resolve.go) and maintain the price → plan table (ListPricePlans,
// SetPricePlan; plans.go), each change audited with operator and reason. Logs carry counts and error classes, never payloads, customer ids
// or signatures.
package inbox
