package inbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aurora-billing/aurora/shared/clock"
	"github.com/aurora-billing/aurora/shared/field"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The price → plan table (stripe_price_plans) decides which plan a
// subscription's price grants. Operators change it with SetPricePlan
// (`auroractl inbox plans set`), each change audited in
// stripe_price_plan_changes (migration 00304) in the change's transaction.
//
// A change applies to events projected from then on: a stored subscription
// keeps the plan it was projected with until its next event (nothing is
// re-projected behind the operator's back), and events deferred
// unmapped_stripe_price / stripe_price_config_missing pick the mapping up at
// their next attempt; their dead letters need a single-event requeue.

// MaxPlanBytes bounds a plan name.
const MaxPlanBytes = 100

// ErrInvalidPricePlan: a price id, plan, operator or reason is missing or
// unusable (the message names the field, never its value).
var ErrInvalidPricePlan = errors.New("inbox: invalid price plan")

// PricePlan is one row of the price → plan table with its latest audited
// change (nil fields when the row predates the audit or was set by SQL).
type PricePlan struct {
	PriceID       string     `json:"price_id"`
	Plan          string     `json:"plan"`
	CreatedAt     time.Time  `json:"created_at"`
	LastChangedBy *string    `json:"last_changed_by"`
	LastChangedAt *time.Time `json:"last_changed_at"`
	LastReason    *string    `json:"last_reason"`
}

// ListPricePlans returns the whole table ordered by price id (it is small:
// one row per Stripe price sold).
func ListPricePlans(ctx context.Context, q Querier) ([]PricePlan, error) {
	rows, err := q.Query(ctx, `
SELECT p.price_id, p.plan, p.created_at, c.operator, c.changed_at, c.reason
  FROM stripe_price_plans p
  LEFT JOIN LATERAL (SELECT operator, changed_at, reason FROM stripe_price_plan_changes c
                      WHERE c.price_id = p.price_id ORDER BY id DESC LIMIT 1) c ON true
 ORDER BY p.price_id`)
	if err != nil {
		return nil, fmt.Errorf("inbox: list price plans: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (PricePlan, error) {
		var p PricePlan
		err := r.Scan(&p.PriceID, &p.Plan, &p.CreatedAt, &p.LastChangedBy, &p.LastChangedAt, &p.LastReason)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("inbox: list price plans: %w", err)
	}
	if out == nil {
		out = []PricePlan{}
	}
	return out, nil
}

// PricePlanInput is one mapping to set and who decided it.
type PricePlanInput struct {
	PriceID  string
	Plan     string
	Operator string
	Reason   string
}

// Validate returns ErrInvalidPricePlan naming the first unusable field: the
// price id and plan obey field.Text (at most field.MaxStripeIDBytes and
// MaxPlanBytes), operator and reason must not be blank.
func (in PricePlanInput) Validate() error {
	for _, f := range []struct{ name, v string }{
		{"price id", in.PriceID}, {"plan", in.Plan}, {"operator", in.Operator}, {"reason", in.Reason},
	} {
		limit := field.MaxStripeIDBytes
		switch f.name {
		case "plan":
			limit = MaxPlanBytes
		case "operator", "reason":
			limit = 1000
		}
		if why := field.Text(f.v, limit); why != "" {
			return fmt.Errorf("%w: %s %s", ErrInvalidPricePlan, f.name, why)
		}
	}
	if strings.TrimSpace(in.PriceID) != in.PriceID || strings.TrimSpace(in.Plan) != in.Plan {
		return fmt.Errorf("%w: price id and plan must not have surrounding spaces", ErrInvalidPricePlan)
	}
	return nil
}

// PricePlanChange is what setting one mapping does (or did): the plan
// before (nil: not mapped), after, and what it touches.
type PricePlanChange struct {
	PriceID   string  `json:"price_id"`
	PriorPlan *string `json:"prior_plan"`
	Plan      string  `json:"plan"`
	// Unchanged: the price already maps to Plan; nothing is written.
	Unchanged bool `json:"unchanged"`
	// Subscriptions stored with this price: they keep their projected
	// plan until their next event.
	Subscriptions int64 `json:"subscriptions"`
	// WaitingPending: pending events deferred unmapped_stripe_price or
	// stripe_price_config_missing (they retry at their next attempt).
	WaitingPending int64 `json:"waiting_pending"`
	// WaitingDeadLetters: dead letters with those reasons (each needs
	// `auroractl inbox requeue`).
	WaitingDeadLetters int64      `json:"waiting_dead_letters"`
	Operator           string     `json:"operator"`
	Reason             string     `json:"reason"`
	ChangedAt          *time.Time `json:"changed_at,omitempty"` // set once applied
}

const sqlPricePlanPreview = `
SELECT (SELECT plan FROM stripe_price_plans WHERE price_id = $1),
       (SELECT count(*) FROM stripe_subscriptions WHERE price_id = $1),
       count(*) FILTER (WHERE dead_letter_at IS NULL),
       count(*) FILTER (WHERE dead_letter_at IS NOT NULL)
  FROM billing_events
 WHERE processed_at IS NULL AND last_reason IN ('unmapped_stripe_price', 'stripe_price_config_missing')`

func previewPricePlan(ctx context.Context, q Querier, in PricePlanInput) (PricePlanChange, error) {
	ch := PricePlanChange{PriceID: in.PriceID, Plan: in.Plan, Operator: in.Operator, Reason: in.Reason}
	if err := q.QueryRow(ctx, sqlPricePlanPreview, in.PriceID).
		Scan(&ch.PriorPlan, &ch.Subscriptions, &ch.WaitingPending, &ch.WaitingDeadLetters); err != nil {
		return PricePlanChange{}, fmt.Errorf("inbox: price plan: %w", err)
	}
	ch.Unchanged = ch.PriorPlan != nil && *ch.PriorPlan == in.Plan
	return ch, nil
}

// PreviewPricePlan returns what SetPricePlan would do, writing nothing.
// Errors: ErrInvalidPricePlan.
func PreviewPricePlan(ctx context.Context, q Querier, in PricePlanInput) (PricePlanChange, error) {
	if err := in.Validate(); err != nil {
		return PricePlanChange{}, err
	}
	return previewPricePlan(ctx, q, in)
}

// SetPricePlan maps in.PriceID to in.Plan and records operator, reason and
// the prior plan in stripe_price_plan_changes, in one transaction (the row
// locked, so concurrent changes of one price are serialised and each audit
// row names the plan it replaced). Setting the plan a price already has
// writes nothing and returns Unchanged. Errors: ErrInvalidPricePlan. c nil
// means the database clock.
func SetPricePlan(ctx context.Context, pool *pgxpool.Pool, c clock.Clock, in PricePlanInput) (PricePlanChange, error) {
	if err := in.Validate(); err != nil {
		return PricePlanChange{}, err
	}
	now := clock.Or(c).Override()
	var out PricePlanChange
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// the lock on an absent price: a transaction-scoped advisory lock
		// per price id, so two first mappings of one price serialise too
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('aurora.inbox.price_plan:' || $1, 0))`, in.PriceID); err != nil {
			return err
		}
		ch, err := previewPricePlan(ctx, tx, in)
		if err != nil {
			return err
		}
		out = ch
		if ch.Unchanged {
			return nil
		}
		var at time.Time
		if err := tx.QueryRow(ctx, `
INSERT INTO stripe_price_plan_changes (price_id, prior_plan, plan, operator, reason, changed_at)
VALUES ($1, $2, $3, $4, $5, coalesce($6::timestamptz, now()))
RETURNING changed_at`, in.PriceID, ch.PriorPlan, in.Plan, in.Operator, in.Reason, now).Scan(&at); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `
INSERT INTO stripe_price_plans (price_id, plan, created_at) VALUES ($1, $2, $3)
ON CONFLICT (price_id) DO UPDATE SET plan = EXCLUDED.plan`, in.PriceID, in.Plan, at); err != nil {
			return err
		}
		out.ChangedAt = &at
		return nil
	})
	if err != nil {
		return PricePlanChange{}, fmt.Errorf("inbox: set price plan: %w", err)
	}
	return out, nil
}
