// Package stripeemulator is a local, stateful emulator of the parts of the
// Stripe API that aurora's export path uses: billing meter events, meter
// event adjustments (cancel), meter event summaries, meters and customers,
// and subscriptions and invoices in the states a test told it (objects.go:
// what `auroractl inbox resolve --from-provider` reads as Stripe's truth).
//
// It is an http.Handler: run it in-process under net/http/httptest, or as a
// server with `aurora stripe-emulator`. Requests and answers have Stripe's
// shapes (stripe-go v76.25.0, API version 2023-10-16): form-encoded bodies,
// `Authorization: Bearer sk_test_…`, `Idempotency-Key`, JSON error bodies
// `{"error":{"type":…,"code":…,"message":…}}` and a `Request-Id: req_…`
// header on every answer.
//
// The rules it keeps, each from Stripe's documentation:
//
//   - A meter event `identifier` is unique for a rolling 24 h (DedupeWindow):
//     a repeat is 400 invalid_request_error "An event already exists with
//     identifier …" with `Stripe-Should-Retry: false`, and is not applied.
//   - A meter event timestamp lies within the past 35 days and at most
//     5 minutes in the future.
//   - Idempotency-Key: the first response of an executed request is saved for
//     24 h; the same key with the same parameters replays it (header
//     `Idempotent-Replayed: true`), the same key with other parameters is
//     400 idempotency_error, the same key while the first request still runs
//     is 409 idempotency_key_in_use. Validation failures and 429s are not
//     saved.
//   - Like live mode, one concurrent call per (customer, meter): a second
//     concurrent meter event for the same pair is 429 rate_limit, and the
//     emulator counts it as an overlap.
//   - A cancel adjustment works only within 24 h of the event's receipt;
//     cancelled events leave the summaries.
//
// Deliberate differences from Stripe: an unknown event name, an unknown
// customer, a missing or non-numeric value and an out-of-window timestamp
// are answered synchronously with 400 and the code Stripe would later put in
// a meter error report (`no_meter`, `meter_event_customer_not_found`, …),
// instead of 200 now and an asynchronous report (Config.AsyncValidation
// restores Stripe's way); summaries are immediately consistent.
//
// The v2 meter event session and stream endpoints are served too
// (stream.go), sharing the identifiers, the dedupe and the oracle.
//
// Faults (latency, 429, 500 saved or not, drop or cut after apply, timeout)
// are injected deterministically from a seed, and scripted answers can be
// queued per identifier; see Faults, ParseFaults, Emulator.Script and
// docs/stripe-emulator.md.
//
// Invariants the tests rely on: every effectively applied event is recorded
// (Applied); an identifier applied twice is counted (DuplicateApplications,
// the double-billing oracle); overlapping calls per (customer, meter) are
// counted (Overlaps). The Emulator is safe for concurrent use, keeps a bounded
// amount of memory per event, and never logs payloads, customer ids or keys.
package stripeemulator
