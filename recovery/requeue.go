package recovery

import (
	"context"
	"fmt"

	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/jackc/pgx/v5"
)

// RequeueInput is a requeue: the operator fixed the cause of a quarantine.
type RequeueInput struct {
	// Expected is what the operator believes the row is; State must be
	// quarantined.
	Expected Expected
	Reason   string // what was fixed, e.g. "mapped api_calls to mtr_123"; required
	Evidence string // optional
	Actor    string // who; required
}

func (s *Service) requeueSpec(in RequeueInput) spec {
	return spec{
		kind: KindRequeue, from: outbox.StateQuarantined, to: outbox.StatePending,
		in: input{Expected: in.Expected, Reason: in.Reason, Evidence: in.Evidence, Actor: in.Actor},
		check: func(ctx context.Context, q outbox.Querier, row outbox.Row, obs *Snapshot) error {
			current, err := currentMappingVersion(ctx, q, row)
			if err != nil {
				return err
			}
			obs.CurrentMappingVersion = &current
			if current != row.MappingVersion {
				return &MappingChangedError{ItemID: row.ID, ItemVersion: row.MappingVersion, CurrentVersion: current}
			}
			// The gate's rule (usage.EraOf); without a watermark the item
			// was buffered because its feature counts, so it still is.
			return stillBuffered(ctx, q, row, obs)
		},
		plan: func(_ context.Context, _ outbox.Querier, row outbox.Row, _ bool) (Change, error) {
			dispatch := row.Dispatch + 1
			return Change{Action: KindRequeue, ItemID: row.ID, From: outbox.StateQuarantined, To: outbox.StatePending,
				ClearQuarantineReason: row.QuarantineReason, Dispatch: &dispatch}, nil
		},
		execute: func(ctx context.Context, tx pgx.Tx, row outbox.Row, c *Change) (*outbox.Row, error) {
			tag, err := tx.Exec(ctx, `
				UPDATE outbox_items
				SET state = 'pending', quarantine_reason = NULL, lease_expires_at = NULL,
				    next_attempt_at = coalesce($2::timestamptz, now()), dispatch = $3
				WHERE id = $1 AND state = 'quarantined'`, row.ID, s.clock.Override(), *c.Dispatch)
			if err != nil {
				return nil, fmt.Errorf("recovery: requeue: %w", err)
			}
			if tag.RowsAffected() != 1 {
				return nil, fmt.Errorf("recovery: requeue: item %d left quarantined under its lock", row.ID)
			}
			// Wake the relay now (the insert trigger only fires on INSERT);
			// delivered on commit.
			if _, err := tx.Exec(ctx, `SELECT pg_notify('aurora_outbox', '')`); err != nil {
				return nil, fmt.Errorf("recovery: requeue: notify: %w", err)
			}
			return nil, nil
		},
	}
}

// Requeue moves a quarantined item back to pending after its cause was
// fixed (seed 000, "Quarantine": "Fix the cause, then requeue the item
// deliberately"): the quarantine reason is cleared, next_attempt_at becomes
// now (the service's clock) and dispatch increments, so the relay publishes
// it again under a new message id. attempts and first_attempt_at are kept:
// the uncertainty horizon still counts from the first attempt, because an
// earlier attempt may have reached the provider.
//
// Refused with *MappingChangedError (ErrMappingChanged) when the feature's
// current mapping version on the destination account differs from the one
// the item was built for, including a feature mapped since an item built
// with version 0 and a mapping removed since: the item was built for a
// mapping that no longer exists. Refused with *StillBufferedError
// (ErrStillBuffered) for an item quarantined period_buffered unless a
// cutover watermark for its feature is scheduled and its period starts on
// or after it: before that the counters bill the period. Other refusals as for Acknowledge (except
// evidence, which is optional here); all are recorded.
func (s *Service) Requeue(ctx context.Context, id int64, in RequeueInput) (Result, error) {
	return s.run(ctx, id, s.requeueSpec(in))
}

// PreviewRequeue returns what Requeue would do, with the same refusals
// (including mapping_changed), writing nothing.
func (s *Service) PreviewRequeue(ctx context.Context, id int64, in RequeueInput) (Preview, error) {
	return s.preview(ctx, id, s.requeueSpec(in))
}
