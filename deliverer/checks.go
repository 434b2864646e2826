package deliverer

import (
	"fmt"
	"time"

	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/outbox"
)

// Stripe's meter event timestamp window (Stripe docs, "Record usage": within
// the past 35 days, at most 5 minutes in the future).
const (
	TimestampMaxAge    = 35 * 24 * time.Hour
	TimestampMaxFuture = 5 * time.Minute
)

// sendContext is what the claim read about an item's destination: account,
// customer, meter mapping and cutover watermark. Nil pointers mean "no row".
type sendContext struct {
	AccountMode           *string
	AccountConfirmed      *bool
	StripeCustomer        *string
	MeterID               *string
	EventName             *string
	CustomerKey           *string
	ValueKey              *string
	CurrentMappingVersion *int32
	Watermark             *time.Time
	Exporter              string // stripe_accounts.exporter; ExporterV1 without an account row
}

// checkItem is the part of a claimed row the pre-send checks read.
type checkItem struct {
	SubjectKind    identity.SubjectKind
	Mode           identity.Mode
	MappingVersion int32
	Quantity       int64
	OccurredAt     time.Time
	PeriodStart    time.Time
}

// Verdict of a failed pre-send check: the quarantine reason and a detail for
// last_error (no customer ids, no payload values).
type checkFailure struct {
	Reason outbox.Reason
	Detail string
}

// preSend runs seed 000's pre-send checks ("Quarantine") at send time, in
// this order, and returns the first that fails (nil = send):
//
//  1. account_unconfirmed: no stripe_accounts row, or confirmed = false.
//  2. mode_mismatch: item mode ≠ account mode, or ≠ the API key's mode.
//  3. feature_unmapped: no meter_mappings row for (account, feature); or the
//     item was built for mapping_version 0 (staged before the feature was
//     mapped); or for another version than the current one (the mapping it
//     was built for no longer exists; a requeue is refused mapping_changed,
//     the item must be restaged for the current version).
//  4. customer_missing: no tenant_billing row, or stripe_customer NULL.
//  5. period_buffered: an event or correction whose period_start is before
//     the cutover watermark of (tenant, feature), else of (”, feature).
//  6. timestamp_outside_window: occurred_at older than 35 days or more than
//     5 minutes ahead of the database clock now; never rewritten.
//  7. negative_quantity: a negative quantity on an item that is not a
//     correction; Stripe meter events cannot carry it. A negative
//     correction is decided by usage.PlanCorrection after these checks
//     (correction.go): a cancel of the corrected event and a restated
//     event, a wait, or negative_quantity when it cannot be cancelled.
func preSend(it checkItem, sc sendContext, keyMode identity.Mode, now time.Time) *checkFailure {
	switch {
	case sc.AccountMode == nil || sc.AccountConfirmed == nil:
		return &checkFailure{outbox.ReasonAccountUnconfirmed, "no stripe_accounts row for the destination account"}
	case !*sc.AccountConfirmed:
		return &checkFailure{outbox.ReasonAccountUnconfirmed, "destination account is not confirmed"}
	case *sc.AccountMode != string(it.Mode):
		return &checkFailure{outbox.ReasonModeMismatch, fmt.Sprintf("item mode %s, account mode %s", it.Mode, *sc.AccountMode)}
	case keyMode != it.Mode:
		return &checkFailure{outbox.ReasonModeMismatch, fmt.Sprintf("item mode %s, API key mode %s", it.Mode, keyMode)}
	case sc.MeterID == nil || sc.EventName == nil || sc.CurrentMappingVersion == nil:
		return &checkFailure{outbox.ReasonFeatureUnmapped, "no meter mapping for the feature on the destination account"}
	case it.MappingVersion == 0:
		return &checkFailure{outbox.ReasonFeatureUnmapped, "item was staged for mapping_version 0 (feature unmapped at stage time)"}
	case it.MappingVersion != *sc.CurrentMappingVersion:
		return &checkFailure{outbox.ReasonFeatureUnmapped, fmt.Sprintf("item built for mapping_version %d, current is %d", it.MappingVersion, *sc.CurrentMappingVersion)}
	case sc.StripeCustomer == nil:
		return &checkFailure{outbox.ReasonCustomerMissing, "tenant has no Stripe customer on the destination account"}
	case (it.SubjectKind == identity.SubjectEvent || it.SubjectKind == identity.SubjectCorrection) &&
		sc.Watermark != nil && it.PeriodStart.Before(*sc.Watermark):
		return &checkFailure{outbox.ReasonPeriodBuffered, fmt.Sprintf("period %s is before the cutover watermark %s", it.PeriodStart.UTC().Format(time.RFC3339), sc.Watermark.UTC().Format(time.RFC3339))}
	case it.OccurredAt.Before(now.Add(-TimestampMaxAge)):
		return &checkFailure{outbox.ReasonTimestampOutsideWindow, fmt.Sprintf("occurred_at %s is more than 35 days before now %s", it.OccurredAt.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))}
	case it.OccurredAt.After(now.Add(TimestampMaxFuture)):
		return &checkFailure{outbox.ReasonTimestampOutsideWindow, fmt.Sprintf("occurred_at %s is more than 5 minutes after now %s", it.OccurredAt.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))}
	case it.Quantity < 0 && it.SubjectKind != identity.SubjectCorrection:
		return &checkFailure{outbox.ReasonNegativeQuantity, "negative quantity: Stripe meter events cannot carry negative values"}
	default:
		return nil
	}
}
