// Package reconciler proves what Stripe has (seed 000, "Reconciliation").
//
// Two questions, two functions:
//
//   - Local (no network, mutates nothing): every ledger position that claims
//     to have reported more than the counter it reported, and the number of
//     open reconciliation items. Its blind spots (BlindSpots): it cannot see
//     under-reporting, asynchronous rejections or invoices.
//   - Reconciler.Run (the provider run): per (destination account, customer,
//     meter) and window, the quantity aurora committed against Stripe's
//     meter event summaries; Stripe's meter error reports matched to items
//     by identifier; finalized invoices' metered lines against what was
//     committed and accepted by their finalization. Each difference is a
//     reconciliation item of one of ten kinds (Kinds, each constant's
//     comment its detection rule); a second run finding the same difference
//     adds nothing. Accepted items that a settled window matching exactly
//     covers move accepted → confirmed (fenced by state and lease token):
//     only the provider's own evidence confirms, never a 200 alone.
//
// Summaries are eventually consistent and Stripe publishes no lag: a window
// is compared only once its end is older than the settle lag (Options.
// SettleLag); a younger window is unsettled, never missing. Windows are the
// UTC hours Stripe groups by (value_grouping_window=hour, start inclusive,
// end exclusive) plus, when the settle cutoff falls inside an hour, that
// hour's settled part as one minute-aligned summary; an item belongs to the
// window its meter event timestamp lies in, so billing periods that do not
// start at midnight change nothing.
//
// ListItems, GetItem and Resolve are the operator's side (seed 000:
// list_items, resolve_item): resolving records who looked and what they did
// and changes nothing else; a blank resolution is ErrInvalidResolution.
package reconciler
