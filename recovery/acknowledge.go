package recovery

import (
	"context"
	"fmt"
	"strings"

	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/aurora-billing/aurora/shared/usage"
	"github.com/jackc/pgx/v5"
)

// AcknowledgeInput is an acknowledgement: the operator found the item in
// the provider's own records.
type AcknowledgeInput struct {
	// Expected is what the operator believes the row is; State must be
	// uncertain.
	Expected Expected
	// ProviderRef is the provider's reference for the item the operator
	// found (e.g. the Stripe request id req_…); stored on the row when
	// non-blank, the row's value is kept otherwise.
	ProviderRef string
	Reason      string // why, e.g. "verified in the Stripe dashboard"; required
	Evidence    string // what was found, e.g. "request log req_… shows a 200 for this identifier"; required
	Actor       string // who; required
}

func (s *Service) acknowledgeSpec(in AcknowledgeInput) spec {
	var providerRef *string
	if p := strings.TrimSpace(in.ProviderRef); p != "" {
		providerRef = &p
	}
	return spec{
		kind: KindAcknowledge, from: outbox.StateUncertain, to: outbox.StateAccepted, requireEvidence: true,
		in: input{Expected: in.Expected, Reason: in.Reason, Evidence: in.Evidence, Actor: in.Actor},
		plan: func(ctx context.Context, q outbox.Querier, row outbox.Row, lock bool) (Change, error) {
			c := Change{Action: KindAcknowledge, ItemID: row.ID, From: outbox.StateUncertain, To: outbox.StateAccepted, ProviderRef: providerRef}
			link, err := findLink(ctx, q, row, lock)
			if err != nil {
				return Change{}, err
			}
			if link != nil && link.Kind == LinkUsageWindow {
				// The window was accepted: the ledger advances to its upper
				// bound, as after a deliverer's acceptance, and the next
				// window starts there (a new identity).
				if _, to, _, ok := usage.WindowBounds(row.SubjectRef, row.Feature, row.PeriodStart); ok {
					c.Window = &WindowChange{
						Tenant: link.Tenant, Feature: link.Feature, PeriodStart: *link.PeriodStart, ClearStagedItemID: row.ID,
						GenerationFrom: *link.Generation, GenerationTo: *link.Generation,
						AcknowledgedToFrom: *link.AcknowledgedTo, AcknowledgedToTo: max(*link.AcknowledgedTo, to),
					}
				}
			}
			return c, nil
		},
		execute: func(ctx context.Context, tx pgx.Tx, row outbox.Row, c *Change) (*outbox.Row, error) {
			tag, err := tx.Exec(ctx, `
				UPDATE outbox_items SET state = 'accepted', provider_ref = coalesce($2, provider_ref)
				WHERE id = $1 AND state = 'uncertain'`, row.ID, c.ProviderRef)
			if err != nil {
				return nil, fmt.Errorf("recovery: acknowledge: %w", err)
			}
			if tag.RowsAffected() != 1 {
				return nil, fmt.Errorf("recovery: acknowledge: item %d left uncertain under its lock", row.ID)
			}
			if w := c.Window; w != nil {
				tag, err := tx.Exec(ctx, `
					UPDATE usage_windows SET staged_item_id = NULL, acknowledged_to = $5, updated_at = now()
					WHERE tenant = $1 AND feature = $2 AND period_start = $3 AND staged_item_id = $4`,
					w.Tenant, w.Feature, w.PeriodStart, row.ID, w.AcknowledgedToTo)
				if err != nil {
					return nil, fmt.Errorf("recovery: acknowledge: advance window: %w", err)
				}
				if tag.RowsAffected() != 1 {
					return nil, fmt.Errorf("recovery: acknowledge: the window link of item %d moved", row.ID)
				}
			}
			return nil, nil
		},
	}
}

// Acknowledge moves an uncertain item to accepted, never to confirmed (seed
// 000, acknowledge_item: "Only the reconciler, holding the provider's own
// evidence, may say confirmed"). It stores in.ProviderRef when given. When
// a usage window still links the item, the window's ledger advances to the
// window's upper bound (acknowledged_to) and its staged link is cleared, as
// after a deliverer's acceptance.
//
// Every call on an existing item writes a recovery action. Refusals,
// recorded and returned with Result.Action set: *InvalidExpectedError
// (ErrInvalidExpected), ErrInvalidActor, ErrInvalidReason,
// ErrInvalidEvidence, *ExpectedStateMismatchError (ErrExpectedStateMismatch,
// carrying the row now). ErrNotFound records nothing.
func (s *Service) Acknowledge(ctx context.Context, id int64, in AcknowledgeInput) (Result, error) {
	return s.run(ctx, id, s.acknowledgeSpec(in))
}

// PreviewAcknowledge returns what Acknowledge would do, with the same
// refusals, writing nothing.
func (s *Service) PreviewAcknowledge(ctx context.Context, id int64, in AcknowledgeInput) (Preview, error) {
	return s.preview(ctx, id, s.acknowledgeSpec(in))
}
