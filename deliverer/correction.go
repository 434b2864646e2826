package deliverer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/aurora-billing/aurora/shared/usage"
)

// Corrections (identity.SubjectCorrection items) pass the pre-send checks
// like events, then usage.PlanCorrection decides, on the claim's database
// clock, what reaches Stripe (the rules are at the top of
// shared/usage/correction.go):
//
//   - send_event: one meter event of the plan's value under the item's own
//     key, through the account's exporter, classified as any event.
//   - cancel_restate: first the cancel of the corrected event (Canceller,
//     Stripe's v1 adjustments for both exporters' accounts; Idempotency-Key
//     = the item's key + ":cancel"), classified by its own table; once it
//     is applied (or was already), the restated value, when above zero, as
//     a meter event under the item's own key through the account's
//     exporter. A crash or failure between the two is safe: the item is
//     attempted again, the plan is the same (the corrected record is still
//     accepted), the cancel replays under the same key and the restate is
//     sent under the same identifier, so each lands once.
//   - wait: the corrected record's outcome is open. The item goes back to
//     pending after a backoff on the number of waits so far, and the
//     claim's attempt is given back (record.Wait), so waiting never
//     spends the attempts limit or the horizon. The attempt row says
//     correction_wait.
//   - not_cancellable: quarantined negative_quantity with the plan's
//     reason (no customer data): a person credits it.
//
// A plan that cannot be read (database error) is a retry with backoff. A
// correction item without its usage_events record (staged on the outbox
// directly) is sent as it stands when positive and quarantined
// negative_quantity when negative: there is no record to cancel from.

// Rules of the deliverer's own correction decisions (outbox_attempts.error_code
// and the Result.Rule of the record).
const (
	RuleCorrectionWait = "correction_wait"
	RuleCorrectionPlan = "correction_plan_failed"
	RuleNotCancellable = "correction_not_cancellable"
	RuleCannotCancel   = "cancel_unsupported"
)

// correct decides and sends correction item cr (its pre-send checks passed).
func (d *Deliverer) correct(ctx context.Context, cr claimResult) record {
	c := cr.Item
	now := cr.Now
	plan, err := d.plan(ctx, c, &now)
	switch {
	case errors.Is(err, usage.ErrNotCorrection) && c.Item.Quantity >= 0:
		// No usage_events record (staged directly on the outbox): a
		// positive correction is its compensating event as it stands.
		plan, err = usage.CorrectionPlan{Action: usage.CorrectionSendEvent, Value: c.Item.Quantity}, nil
	case errors.Is(err, usage.ErrNotCorrection):
		plan, err = usage.CorrectionPlan{Action: usage.CorrectionNotCancellable, Why: "no correction record names the record to cancel"}, nil
	}
	if err != nil {
		d.m.errors.WithLabelValues("correction_plan").Inc()
		d.log.Error("deliverer: correction plan failed; retried", "item", c.ItemID, "err", err)
		return d.withResult(c, Result{Outcome: OutcomeRetry, Rule: RuleCorrectionPlan, ErrorCode: RuleCorrectionPlan})
	}
	switch plan.Action {
	case usage.CorrectionSendEvent:
		return d.withResult(c, d.send(ctx, c, plan.Value))
	case usage.CorrectionCancelRestate:
		canc, ok := d.exp.(Canceller)
		if !ok {
			return record{Item: c, Outcome: OutcomeQuarantined, Reason: outbox.ReasonProviderConfiguration,
				LastError: string(outbox.ReasonProviderConfiguration) + ": the exporter cannot cancel meter events",
				Result:    Result{Outcome: OutcomeQuarantined, Reason: outbox.ReasonProviderConfiguration, Rule: RuleCannotCancel}}
		}
		req := CancelRequest{ItemID: c.ItemID, Account: c.Account, Key: plan.CancelIdempotencyKey,
			EventName: *c.Ctx.EventName, Identifier: plan.CancelIdentifier}
		res := d.guarded(ctx, c.ItemID, func(ctx context.Context) Result { return canc.Cancel(ctx, req) })
		if res.Outcome != OutcomeAccepted || plan.Value == 0 {
			return d.withResult(c, res)
		}
		return d.withResult(c, d.send(ctx, c, plan.Value))
	case usage.CorrectionWait:
		var waits int
		if err := d.db.QueryRow(ctx, `SELECT count(*) FROM outbox_attempts WHERE item_id = $1 AND error_code = $2`,
			c.ItemID, RuleCorrectionWait).Scan(&waits); err != nil {
			d.m.errors.WithLabelValues("correction_plan").Inc()
		}
		return record{Item: c, Outcome: OutcomeRetry, Wait: true,
			RetryDelay: Backoff(waits+1, d.s.backoffBase, d.s.backoffCap, d.rnd),
			LastError:  RuleCorrectionWait + ": " + plan.Why,
			Result:     Result{Outcome: OutcomeRetry, Rule: RuleCorrectionWait, ErrorCode: RuleCorrectionWait}}
	case usage.CorrectionNotCancellable:
		return record{Item: c, Outcome: OutcomeQuarantined, Reason: outbox.ReasonNegativeQuantity,
			LastError: string(outbox.ReasonNegativeQuantity) + ": " + plan.Why,
			Result:    Result{Outcome: OutcomeQuarantined, Reason: outbox.ReasonNegativeQuantity, Rule: RuleNotCancellable}}
	default:
		return d.withResult(c, Result{Outcome: OutcomeRetry, Rule: fmt.Sprintf("%s(%s)", RuleCorrectionPlan, plan.Action)})
	}
}

// plan reads item c and returns usage.PlanCorrection's answer at now.
func (d *Deliverer) plan(ctx context.Context, c claimed, now *time.Time) (usage.CorrectionPlan, error) {
	row, err := outbox.Get(ctx, d.db, c.ItemID)
	if err != nil {
		return usage.CorrectionPlan{}, err
	}
	return usage.PlanCorrection(ctx, d.db, row, now)
}

// send sends c's meter event with value through the account's exporter.
func (d *Deliverer) send(ctx context.Context, c claimed, value int64) Result {
	req := request(c)
	req.Value = value
	return d.guarded(ctx, c.ItemID, func(ctx context.Context) Result { return d.exp.Export(ctx, req) })
}
