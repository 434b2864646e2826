// Package reporter is the buffered reporter of seed 000 ("Identity, and the
// key that makes retries safe"; "Cutting a feature over from counting to
// recording"): for every (tenant, feature, period) counter of the buffered
// era it stages a usage window, from the ledger position acknowledged so
// far to the current count, as one export item, in one transaction with
// the usage_windows row locked.
//
// Identity of a window (usage.WindowSubjectRef, the contract shared with
// recovery):
//
//	usage:<feature>:<period start RFC 3339 UTC>:<from>:<to>        generation 0
//	usage:<feature>:<period start RFC 3339 UTC>:<from>:<to>:r<g>   after g abandons
//
// Invariants kept here:
//   - one staged window per period at a time (usage_windows.staged_item_id);
//     restaging it rebuilds the same identity and payload and collapses onto
//     the same row; an identity is never re-pointed at another payload;
//   - while a staged window is unresolved (pending, leased, uncertain,
//     quarantined, rejected-but-still-linked) the count may grow: the window
//     is left alone and the growth goes out in the next window, which starts
//     at this window's upper bound once it is accepted;
//   - acceptance (accepted or confirmed) advances the ledger:
//     acknowledged_to = the window's upper bound, the link is cleared, and
//     the next window is a new identity;
//   - an abandon (recovery clears the link and bumps the generation) makes
//     the same bounds restage under a new identity (":r<g>");
//   - only periods of the buffered era are staged (usage.EraOf): with a
//     cutover watermark, periods starting before it; without one, features
//     whose configured source is counters. The watermark is read under the
//     feature's shared cutover lock, so a schedule or reschedule cannot move
//     it between the read and the commit;
//   - a count below the acknowledged position (impossible: counters only
//     grow) is reported as *DriftError and nothing is staged.
//
// A window item's occurred_at (the meter event timestamp) is
// min(period end − 1 s, now), truncated to the second, fixed at stage time:
// the usage lands in its own period at Stripe, and a window of an open period
// is never stamped in the future. A window staged more than 35 days after its
// period ended is outside Stripe's timestamp window and the deliverer
// quarantines it timestamp_outside_window (visible, not lost).
package reporter
