package recovery

import (
	"context"
	"fmt"

	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/aurora-billing/aurora/shared/usage"
	"github.com/jackc/pgx/v5"
)

// AbandonInput is an abandonment: the operator found no trace of the item
// in the provider's records.
type AbandonInput struct {
	// Expected is what the operator believes the row is; State must be
	// uncertain.
	Expected Expected
	Reason   string // why, e.g. "no meter event for this identifier in the request logs"; required
	Evidence string // what was searched, e.g. "searched 09:00Z to 10:00Z, 0 results"; required
	Actor    string // who; required
}

func (s *Service) abandonSpec(in AbandonInput) spec {
	return spec{
		kind: KindAbandon, from: outbox.StateUncertain, to: outbox.StateRejected, requireEvidence: true,
		in: input{Expected: in.Expected, Reason: in.Reason, Evidence: in.Evidence, Actor: in.Actor},
		plan: func(ctx context.Context, q outbox.Querier, row outbox.Row, lock bool) (Change, error) {
			c := Change{Action: KindAbandon, ItemID: row.ID, From: outbox.StateUncertain, To: outbox.StateRejected}
			link, err := findLink(ctx, q, row, lock)
			if err != nil || link == nil {
				return c, err
			}
			switch link.Kind {
			case LinkUsageWindow:
				next := *link.Generation + 1
				c.Window = &WindowChange{
					Tenant: link.Tenant, Feature: link.Feature, PeriodStart: *link.PeriodStart, ClearStagedItemID: row.ID,
					GenerationFrom: *link.Generation, GenerationTo: next,
					AcknowledgedToFrom: *link.AcknowledgedTo, AcknowledgedToTo: *link.AcknowledgedTo,
				}
				if from, to, _, ok := usage.WindowBounds(row.SubjectRef, row.Feature, row.PeriodStart); ok {
					c.Window.SameBoundsSubjectRef = usage.WindowSubjectRef(row.Feature, row.PeriodStart, from, to, next)
					c.Window.SameBoundsKey = identity.Key(row.Tenant, row.SubjectKind, c.Window.SameBoundsSubjectRef, row.DestinationAccount)
				}
			case LinkUsageEvent:
				if c.Restage, err = planEventRestage(ctx, q, row, link); err != nil {
					return Change{}, err
				}
			}
			return c, nil
		},
		execute: func(ctx context.Context, tx pgx.Tx, row outbox.Row, c *Change) (*outbox.Row, error) {
			tag, err := tx.Exec(ctx, `UPDATE outbox_items SET state = 'rejected' WHERE id = $1 AND state = 'uncertain'`, row.ID)
			if err != nil {
				return nil, fmt.Errorf("recovery: abandon: %w", err)
			}
			if tag.RowsAffected() != 1 {
				return nil, fmt.Errorf("recovery: abandon: item %d left uncertain under its lock", row.ID)
			}
			if w := c.Window; w != nil {
				var gen int
				err := tx.QueryRow(ctx, `
					UPDATE usage_windows SET staged_item_id = NULL, generation = generation + 1, updated_at = now()
					WHERE tenant = $1 AND feature = $2 AND period_start = $3 AND staged_item_id = $4
					RETURNING generation`,
					w.Tenant, w.Feature, w.PeriodStart, row.ID).Scan(&gen)
				if err != nil {
					return nil, fmt.Errorf("recovery: abandon: clear window link: %w", err)
				}
				if gen != w.GenerationTo {
					return nil, fmt.Errorf("recovery: abandon: window generation moved to %d, planned %d", gen, w.GenerationTo)
				}
			}
			if c.Restage != nil {
				return restageEvent(ctx, tx, row, c.Restage)
			}
			return nil, nil
		},
	}
}

// Abandon moves an uncertain item to rejected and clears its staged link so
// the subject restages under a new identity (seed 000, abandon_item: "That
// restaging is a send. Be sure."):
//
//   - a usage window (usage_windows.staged_item_id = id): the link is set to
//     NULL and the window's generation incremented in the same transaction;
//     the buffered reporter then restages it under
//     usage.WindowSubjectRef(…, generation), a new key even when the bounds
//     did not change;
//   - a durable event or correction (usage_events.item_id = id): there is no
//     reporter loop for events, so the event is restaged here, in the same
//     transaction, as "<kind>:<event_id>:r<g>" (see Restage) and the event's
//     link moves to the new item (Result.Restaged);
//   - an item no usage fact links: rejected, nothing restages.
//
// The old item stays rejected; nothing automatic ever leaves rejected.
// Refusals are recorded as for Acknowledge; ErrNotFound records nothing.
func (s *Service) Abandon(ctx context.Context, id int64, in AbandonInput) (Result, error) {
	return s.run(ctx, id, s.abandonSpec(in))
}

// PreviewAbandon returns what Abandon would do (including the identity the
// subject would restage under), with the same refusals, writing nothing.
func (s *Service) PreviewAbandon(ctx context.Context, id int64, in AbandonInput) (Preview, error) {
	return s.preview(ctx, id, s.abandonSpec(in))
}
