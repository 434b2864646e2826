package usage

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/jackc/pgx/v5"
)

// How a correction reaches Stripe (seed 000 and Stripe's meter event
// adjustments: Stripe documents that an adjustment can cancel an event only
// within 24 h of receiving it; a sum meter's value cannot go below zero):
//
//   - A positive correction (+d) is a compensating meter event of value d
//     under the correction's own identifier, at the correction's timestamp
//     (which lies in the corrected record's period). Valid at any time within
//     Stripe's 35-day timestamp window.
//   - A negative correction (−d) of record X cancels X's meter event
//     (POST /v1/billing/meter_event_adjustments, type cancel, identifier =
//     X's idempotency key) and then, when the restated value v(X) − d is
//     above zero, sends a meter event of that value under the correction's
//     own identifier. X can be cancelled once: a later negative correction
//     must name the correction that restated X (the record that now carries
//     the value at Stripe), so chains stay linear.
//   - The cancel is attempted only while X reached Stripe less than
//     CancelWindow ago, measured from X's first attempt (an upper bound on
//     the time since Stripe received it). Past it, or when X never reached
//     Stripe (rejected), the correction is quarantined negative_quantity
//     (outbox.ReasonNegativeQuantity, the deliverer's reason for a value
//     Stripe cannot carry): a negative compensating event is not possible on
//     a sum meter, so a person credits it (e.g. a credit note).
//   - While X's own outcome is open (pending, leased, uncertain,
//     quarantined) the correction waits: cancelling an identifier Stripe has
//     not seen would fail, and X may still be sent.
//
// The value a record carries at Stripe, v(X): an event's quantity; a
// positive correction's quantity; a negative correction's v(target) + its
// quantity.

// CancelWindow bounds the time since the cancelled record's first attempt
// within which a cancel is attempted: 23 h, inside Stripe's 24 h adjustment
// window with the same margin as the uncertainty horizon.
const CancelWindow = 23 * time.Hour

var (
	// ErrCorrectedUnknown: the correction names a record that was never
	// recorded for the tenant. Nothing was written.
	ErrCorrectedUnknown = errors.New("usage: corrected_event_unknown")
	// ErrCorrectionExceeds: a negative correction removes more than the
	// record carries at Stripe (a sum meter cannot go below zero). Nothing
	// was written.
	ErrCorrectionExceeds = errors.New("usage: correction_exceeds_value")
	// ErrAlreadyCancelled: the record was already cancelled by another
	// negative correction; see *AlreadyCancelledError. Nothing was written.
	ErrAlreadyCancelled = errors.New("usage: already_cancelled")
	// ErrNotCorrection: PlanCorrection was given an item that is not a
	// correction, or whose correction record is missing.
	ErrNotCorrection = errors.New("usage: not_a_correction")
)

// AlreadyCancelledError names the correction that already cancelled the
// record: correct that one instead. It wraps ErrAlreadyCancelled.
type AlreadyCancelledError struct {
	EventID     string // the record named by the refused correction
	CancelledBy string // the correction that cancelled it and now carries its value
}

func (e *AlreadyCancelledError) Error() string {
	return fmt.Sprintf("usage: already_cancelled: %q was cancelled by correction %q; correct that one instead", e.EventID, e.CancelledBy)
}

// Unwrap returns ErrAlreadyCancelled.
func (e *AlreadyCancelledError) Unwrap() error { return ErrAlreadyCancelled }

type recorded struct {
	kind       identity.SubjectKind
	feature    string
	quantity   int64
	occurredAt time.Time
	corrects   *string
	itemID     *int64
}

func readRecorded(ctx context.Context, q outbox.Querier, tenant, eventID string, lock bool) (recorded, error) {
	sql := `SELECT kind, feature, quantity, occurred_at, corrects_event_id, item_id FROM usage_events WHERE tenant = $1 AND event_id = $2`
	if lock {
		sql += ` FOR UPDATE`
	}
	var r recorded
	var kind string
	err := q.QueryRow(ctx, sql, tenant, eventID).Scan(&kind, &r.feature, &r.quantity, &r.occurredAt, &r.corrects, &r.itemID)
	if errors.Is(err, pgx.ErrNoRows) {
		return recorded{}, fmt.Errorf("%w: %q", ErrCorrectedUnknown, eventID)
	}
	if err != nil {
		return recorded{}, fmt.Errorf("usage: read event: %w", err)
	}
	r.kind = identity.SubjectKind(kind)
	return r, nil
}

// ValueAtStripe returns v(eventID): the value the record carries at Stripe
// once delivered (see the rules above). ErrCorrectedUnknown when a record in
// the chain is missing.
func ValueAtStripe(ctx context.Context, q outbox.Querier, tenant, eventID string) (int64, error) {
	var acc int64
	id := eventID
	for range 1000 {
		r, err := readRecorded(ctx, q, tenant, id, false)
		if err != nil {
			return 0, err
		}
		if r.kind == identity.SubjectEvent || r.quantity >= 0 || r.corrects == nil {
			return acc + r.quantity, nil
		}
		acc += r.quantity
		id = *r.corrects
	}
	return 0, fmt.Errorf("usage: correction chain of %q is longer than 1000", eventID)
}

// CheckCorrection checks correction ev against the record it names, locking
// that record (FOR UPDATE) so corrections of one record are decided one at a
// time: the record exists for the tenant (ErrCorrectedUnknown), has the same
// feature and period (*FieldError feature / occurred_at), the quantity is
// not zero (*FieldError quantity), and a negative correction neither exceeds
// v(record) (ErrCorrectionExceeds) nor names a record another negative
// correction already cancelled (*AlreadyCancelledError). Re-checking an
// already recorded correction passes (it does not conflict with itself).
func CheckCorrection(ctx context.Context, tx pgx.Tx, p Period, ev Event) error {
	if ev.Quantity == 0 {
		return &FieldError{"quantity", "a correction must change the quantity (non-zero)"}
	}
	target, err := readRecorded(ctx, tx, ev.Tenant, ev.CorrectsEventID, true)
	if err != nil {
		return err
	}
	if target.feature != ev.Feature {
		return &FieldError{"feature", "must be the feature of the corrected record"}
	}
	if !p.Start(target.occurredAt).Equal(p.Start(ev.OccurredAt)) {
		return &FieldError{"occurred_at", "must lie in the period of the corrected record"}
	}
	if ev.Quantity > 0 {
		return nil
	}
	var by string
	err = tx.QueryRow(ctx, `
		SELECT event_id FROM usage_events
		WHERE tenant = $1 AND corrects_event_id = $2 AND kind = 'correction' AND quantity < 0 AND event_id <> $3
		ORDER BY recorded_at LIMIT 1`, ev.Tenant, ev.CorrectsEventID, ev.EventID).Scan(&by)
	switch {
	case err == nil:
		return &AlreadyCancelledError{EventID: ev.CorrectsEventID, CancelledBy: by}
	case !errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("usage: check correction: %w", err)
	}
	v, err := ValueAtStripe(ctx, tx, ev.Tenant, ev.CorrectsEventID)
	if err != nil {
		return err
	}
	if v+ev.Quantity < 0 {
		return fmt.Errorf("%w: %q carries %d, the correction removes %d", ErrCorrectionExceeds, ev.CorrectsEventID, v, -ev.Quantity)
	}
	return nil
}

// CorrectionAction is what a deliverer does with a correction item now.
type CorrectionAction string

const (
	// CorrectionSendEvent: send one meter event of Value under the item's
	// own identifier (a positive, compensating correction).
	CorrectionSendEvent CorrectionAction = "send_event"
	// CorrectionCancelRestate: cancel CancelIdentifier (a meter event
	// adjustment, Idempotency-Key CancelIdempotencyKey), then, when Value >
	// 0, send a meter event of Value under the item's own identifier.
	CorrectionCancelRestate CorrectionAction = "cancel_restate"
	// CorrectionWait: the corrected record's outcome is still open; leave
	// the item for a later attempt (not a failure).
	CorrectionWait CorrectionAction = "wait"
	// CorrectionNotCancellable: quarantine the item with
	// outbox.ReasonNegativeQuantity.
	CorrectionNotCancellable CorrectionAction = "not_cancellable"
)

// CorrectionPlan is PlanCorrection's answer.
type CorrectionPlan struct {
	Action               CorrectionAction
	Value                int64  // meter event value under the item's identifier (send_event, cancel_restate; 0 = none)
	CancelIdentifier     string // cancel_restate: the identifier to cancel (the corrected record's item key)
	CancelIdempotencyKey string // cancel_restate: Idempotency-Key of the cancel (item key + ":cancel")
	Why                  string // wait, not_cancellable: a short explanation without customer data
}

// PlanCorrection decides how correction item row reaches Stripe now (see
// the rules at the top of this file). now overrides the database clock
// (nil = now()). ErrNotCorrection when row is not a correction item or its
// usage_events record is missing.
func PlanCorrection(ctx context.Context, q outbox.Querier, row outbox.Row, now *time.Time) (CorrectionPlan, error) {
	if row.SubjectKind != identity.SubjectCorrection {
		return CorrectionPlan{}, fmt.Errorf("%w: item %d is %s", ErrNotCorrection, row.ID, row.SubjectKind)
	}
	var eventID, corrects string
	var d int64
	err := q.QueryRow(ctx, `
		SELECT event_id, quantity, corrects_event_id FROM usage_events
		WHERE tenant = $1 AND kind = 'correction'
		  AND (item_id = $2 OR 'correction:' || event_id = $3 OR starts_with($3, 'correction:' || event_id || ':r'))
		ORDER BY item_id IS NOT DISTINCT FROM $2 DESC LIMIT 1`, row.Tenant, row.ID, row.SubjectRef).Scan(&eventID, &d, &corrects)
	if errors.Is(err, pgx.ErrNoRows) {
		return CorrectionPlan{}, fmt.Errorf("%w: no correction record for item %d", ErrNotCorrection, row.ID)
	}
	if err != nil {
		return CorrectionPlan{}, fmt.Errorf("usage: plan correction: %w", err)
	}
	if d >= 0 {
		return CorrectionPlan{Action: CorrectionSendEvent, Value: d}, nil
	}
	target, err := readRecorded(ctx, q, row.Tenant, corrects, false)
	if err != nil {
		return CorrectionPlan{}, err
	}
	if target.itemID == nil {
		return CorrectionPlan{Action: CorrectionNotCancellable, Why: "the corrected record has no export item"}, nil
	}
	targetRow, err := outbox.Get(ctx, q, *target.itemID)
	if err != nil {
		return CorrectionPlan{}, err
	}
	switch targetRow.State {
	case outbox.StatePending, outbox.StateLeased, outbox.StateUncertain, outbox.StateQuarantined:
		return CorrectionPlan{Action: CorrectionWait, Why: "the corrected record is " + string(targetRow.State)}, nil
	case outbox.StateRejected:
		return CorrectionPlan{Action: CorrectionNotCancellable, Why: "the corrected record never reached Stripe (rejected)"}, nil
	case outbox.StateAccepted, outbox.StateConfirmed:
	default:
		return CorrectionPlan{}, fmt.Errorf("usage: plan correction: unknown state %q", targetRow.State)
	}
	received := targetRow.UpdatedAt
	if targetRow.FirstAttemptAt != nil {
		received = *targetRow.FirstAttemptAt
	}
	var within bool
	if err := q.QueryRow(ctx, `SELECT coalesce($1::timestamptz, now()) - $2::timestamptz < make_interval(secs => $3)`,
		now, received, CancelWindow.Seconds()).Scan(&within); err != nil {
		return CorrectionPlan{}, fmt.Errorf("usage: plan correction: clock: %w", err)
	}
	if !within {
		return CorrectionPlan{Action: CorrectionNotCancellable, Why: "the corrected record reached Stripe more than 23 h ago"}, nil
	}
	v, err := ValueAtStripe(ctx, q, row.Tenant, corrects)
	if err != nil {
		return CorrectionPlan{}, err
	}
	return CorrectionPlan{
		Action:               CorrectionCancelRestate,
		Value:                max(v+d, 0),
		CancelIdentifier:     targetRow.IdempotencyKey,
		CancelIdempotencyKey: row.IdempotencyKey + ":cancel",
	}, nil
}
