// Package cutover moves a feature from counting to recording (seed 000,
// "Cutting a feature over from counting to recording"): Schedule sets the
// watermark of (tenant, feature), Status says whether the buffered side has
// drained, and Reschedule — a recovery action with an expected state, a
// reason and evidence, recorded in recovery_actions whether it applied or
// was refused — is the only way to move it.
//
// The watermark makes the split exclusive: the buffered reporter stages a
// window only for periods starting before it; the event side stages events
// for earlier periods quarantined period_buffered (usage.Gate, and the
// deliverer again at send time). Tenant "" is the all-tenants row; a
// tenant's own row overrides it.
//
// The procedure, in order, and the order is the point:
//
//  1. auroractl cutover schedule --feature api_calls --at 2026-10-01T00:00:00Z --yes
//  2. keep the reporter running; watch auroractl cutover status --feature api_calls
//     until drained is true;
//  3. only then deploy AURORA_FEATURE_SOURCES=api_calls:events.
//
// Nothing here writes the source switch: moving the watermark and changing
// the source are two decisions.
//
// Invariants kept here, under the feature's exclusive cutover lock
// (usage.LockCutoverExclusive; the reporter and usage.Gate take it shared):
//   - a (tenant, feature) has at most one cutover; a second Schedule, or a
//     tenant's Schedule while the all-tenants row governs the feature, is
//     ErrAlreadyScheduled;
//   - a watermark starts a usage period (the configured period), so the
//     split never cuts a period in two;
//   - scheduling or moving a watermark never hands a period to a side that
//     has not exported it while the other side already has: a window staged
//     or acknowledged for a period that would become recording, or an event
//     exported for a period that would become buffered, refuses the call
//     (*ConflictError, ErrExportedAcrossWatermark).
package cutover
