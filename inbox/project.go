package inbox

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// GracePeriod is how long a tenant keeps its plan after a failed invoice
// payment (billing_status grace, grace_until = the failure's Stripe time +
// GracePeriod). Ours; the seed names grace without a length.
const GracePeriod = 7 * 24 * time.Hour

// projector applies one event inside the event's transaction. now is the
// transaction's clock (database or override).
type projector struct {
	tx  pgx.Tx
	now time.Time
}

func (p projector) project(ctx context.Context, ev *event) (decision, error) {
	switch ev.Kind {
	case kindCheckout:
		return p.checkout(ctx, ev)
	case kindSubscription:
		return p.subscription(ctx, ev)
	case kindInvoice:
		return p.invoice(ctx, ev)
	case kindOther:
		return processed(OutcomeIgnored), nil
	default:
		return decision{}, errors.New("inbox: unknown event kind")
	}
}

// tenantOf returns the tenant linked to customer, or "".
func (p projector) tenantOf(ctx context.Context, customer string) (string, error) {
	var tenant string
	err := p.tx.QueryRow(ctx, `SELECT tenant FROM stripe_customer_links WHERE customer_id = $1`, customer).Scan(&tenant)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	return tenant, err
}

// otherLiveSubscription reports whether tenant has a nonterminal
// subscription other than sub.
func (p projector) otherLiveSubscription(ctx context.Context, tenant, sub string) (bool, error) {
	var exists bool
	err := p.tx.QueryRow(ctx, `
SELECT EXISTS (SELECT 1 FROM stripe_subscriptions
                WHERE tenant = $1 AND subscription_id <> $2
                  AND status NOT IN ('canceled', 'incomplete_expired'))`, tenant, sub).Scan(&exists)
	return exists, err
}

// checkout links the session's customer to its tenant and wakes the
// customer's postponed events (seed 003).
func (p projector) checkout(ctx context.Context, ev *event) (decision, error) {
	co := ev.Checkout
	if ev.Customer == "" || co.Tenant == "" {
		if co.Mode == "subscription" {
			// a subscription checkout we cannot attribute: an operator decides
			return withReason(ReasonUnrecognizedStripePayload), nil
		}
		return processed(OutcomeIgnored), nil // a one-off payment, not a tenant's plan
	}
	linked, err := p.tenantOf(ctx, ev.Customer)
	if err != nil {
		return decision{}, err
	}
	if linked != "" && linked != co.Tenant {
		return withReason(ReasonAmbiguousCustomerLinkage), nil // customer → second tenant
	}
	if linked == "" {
		var other string
		err := p.tx.QueryRow(ctx, `SELECT customer_id FROM stripe_customer_links WHERE tenant = $1`, co.Tenant).Scan(&other)
		switch {
		case err == nil:
			return withReason(ReasonAmbiguousCustomerLinkage), nil // tenant → another customer
		case !errors.Is(err, pgx.ErrNoRows):
			return decision{}, err
		}
	}
	if co.SubscriptionID != "" {
		competing, err := p.otherLiveSubscription(ctx, co.Tenant, co.SubscriptionID)
		if err != nil {
			return decision{}, err
		}
		if competing {
			return withReason(ReasonAmbiguousMultiSubscription), nil
		}
	}
	outcome := OutcomeUnchanged // identical tenant/customer replay
	if linked == "" {
		tag, err := p.tx.Exec(ctx, `
INSERT INTO stripe_customer_links (customer_id, tenant, linked_by_event, linked_at)
VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING`, ev.Customer, co.Tenant, ev.ID, p.now)
		if err != nil {
			return decision{}, err
		}
		if tag.RowsAffected() == 0 {
			// a concurrent checkout linked either side first (the customer
			// lock does not cover the tenant): not ours to decide
			return withReason(ReasonAmbiguousCustomerLinkage), nil
		}
		if _, err := p.tx.Exec(ctx, `
INSERT INTO tenant_entitlements (tenant, customer_id, updated_at) VALUES ($1, $2, $3)
ON CONFLICT (tenant) DO NOTHING`, co.Tenant, ev.Customer, p.now); err != nil {
			return decision{}, err
		}
		outcome = OutcomeApplied
	}
	// wake the customer's pending rows now; revive its customer_not_linked
	// dead letters with a fresh budget. Unrelated dead letters stay.
	if _, err := p.tx.Exec(ctx, `
UPDATE billing_events
   SET next_attempt_at = $2,
       attempts = CASE WHEN last_reason = 'customer_not_linked' THEN 0 ELSE attempts END
 WHERE customer_id = $1 AND processed_at IS NULL AND dead_letter_at IS NULL AND event_id <> $3`,
		ev.Customer, p.now, ev.ID); err != nil {
		return decision{}, err
	}
	if _, err := p.tx.Exec(ctx, `
UPDATE billing_events
   SET dead_letter_at = NULL, attempts = 0, next_attempt_at = $2
 WHERE customer_id = $1 AND processed_at IS NULL AND dead_letter_at IS NOT NULL
   AND last_reason = 'customer_not_linked'`, ev.Customer, p.now); err != nil {
		return decision{}, err
	}
	return processed(outcome), nil
}

type storedSubscription struct {
	tenant            string
	status            string
	priceID           *string
	currentPeriodEnd  *time.Time
	cancelAtPeriodEnd bool
	lastEventCreated  time.Time
}

// subscription applies a customer.subscription.* snapshot under the
// subscription timestamp guard (seed 003).
func (p projector) subscription(ctx context.Context, ev *event) (decision, error) {
	sub := ev.Subscription
	tenant, err := p.tenantOf(ctx, ev.Customer)
	if err != nil {
		return decision{}, err
	}
	if tenant == "" {
		return withReason(ReasonCustomerNotLinked), nil
	}
	competing, err := p.otherLiveSubscription(ctx, tenant, sub.ID)
	if err != nil {
		return decision{}, err
	}
	if competing {
		return withReason(ReasonAmbiguousMultiSubscription), nil
	}
	var price string
	if len(sub.PriceIDs) > 0 {
		price = sub.PriceIDs[0]
	}
	var old storedSubscription
	err = p.tx.QueryRow(ctx, `
SELECT tenant, status, price_id, current_period_end, cancel_at_period_end, last_event_created
  FROM stripe_subscriptions WHERE subscription_id = $1`, sub.ID).
		Scan(&old.tenant, &old.status, &old.priceID, &old.currentPeriodEnd, &old.cancelAtPeriodEnd, &old.lastEventCreated)
	exists := err == nil
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return decision{}, err
	}
	if exists {
		if old.tenant != tenant {
			return withReason(ReasonAmbiguousCustomerLinkage), nil
		}
		switch {
		case ev.Created.Before(old.lastEventCreated):
			return processed(OutcomeStale), nil
		case ev.Created.Equal(old.lastEventCreated):
			if old.status == sub.Status && deref(old.priceID) == price && old.cancelAtPeriodEnd == sub.CancelAtPeriodEnd &&
				sameTime(old.currentPeriodEnd, sub.CurrentPeriodEnd) {
				return processed(OutcomeUnchanged), nil
			}
			return withReason(ReasonAmbiguousSubscriptionOrder), nil
		}
	}
	var plan *string
	if !terminalSubscriptionStatus(sub.Status) {
		if len(sub.PriceIDs) == 0 {
			return withReason(ReasonUnrecognizedStripePayload), nil
		}
		pl, r, err := p.planFor(ctx, sub.PriceIDs)
		if err != nil {
			return decision{}, err
		}
		if r != "" {
			return withReason(r), nil
		}
		plan = &pl
	}
	if _, err := p.tx.Exec(ctx, `
INSERT INTO stripe_subscriptions (subscription_id, customer_id, tenant, status, price_id, plan, current_period_end,
                                  cancel_at_period_end, last_event_id, last_event_created, updated_at)
VALUES ($1, $2, $3, $4, NULLIF($5, ''), $6, $7, $8, $9, $10, $11)
ON CONFLICT (subscription_id) DO UPDATE SET
    status = EXCLUDED.status, price_id = EXCLUDED.price_id, plan = EXCLUDED.plan,
    current_period_end = EXCLUDED.current_period_end, cancel_at_period_end = EXCLUDED.cancel_at_period_end,
    last_event_id = EXCLUDED.last_event_id, last_event_created = EXCLUDED.last_event_created,
    updated_at = EXCLUDED.updated_at`,
		sub.ID, ev.Customer, tenant, sub.Status, price, plan, sub.CurrentPeriodEnd, sub.CancelAtPeriodEnd,
		ev.ID, ev.Created, p.now); err != nil {
		return decision{}, err
	}
	// the plan follows the subscription; billing status is the invoices'
	// alone, so an earlier subscription never undoes a later invoice status
	var granted *string
	if entitledSubscriptionStatus(sub.Status) {
		granted = plan
	}
	if _, err := p.tx.Exec(ctx, `
INSERT INTO tenant_entitlements (tenant, customer_id, subscription_id, subscription_status, plan, updated_at)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (tenant) DO UPDATE SET
    subscription_id = EXCLUDED.subscription_id, subscription_status = EXCLUDED.subscription_status,
    plan = EXCLUDED.plan, updated_at = EXCLUDED.updated_at`,
		tenant, ev.Customer, sub.ID, sub.Status, granted, p.now); err != nil {
		return decision{}, err
	}
	return processed(OutcomeApplied), nil
}

// planFor maps the subscription's prices to one plan: every price must be
// mapped; the first item's plan is the tenant's. An empty mapping table is
// stripe_price_config_missing.
func (p projector) planFor(ctx context.Context, prices []string) (string, Reason, error) {
	rows, err := p.tx.Query(ctx, `SELECT price_id, plan FROM stripe_price_plans WHERE price_id = ANY($1)`, prices)
	if err != nil {
		return "", "", err
	}
	plans := map[string]string{}
	for rows.Next() {
		var price, plan string
		if err := rows.Scan(&price, &plan); err != nil {
			rows.Close()
			return "", "", err
		}
		plans[price] = plan
	}
	if err := rows.Err(); err != nil {
		return "", "", err
	}
	for _, pr := range prices {
		if _, ok := plans[pr]; !ok {
			var mapped bool
			if err := p.tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM stripe_price_plans)`).Scan(&mapped); err != nil {
				return "", "", err
			}
			if !mapped {
				return "", ReasonStripePriceConfigMissing, nil
			}
			return "", ReasonUnmappedStripePrice, nil
		}
	}
	return plans[prices[0]], "", nil
}

// invoice applies invoice.paid / invoice.payment_succeeded /
// invoice.payment_failed under the invoice guard and the separate
// customer-level guard (seed 003).
func (p projector) invoice(ctx context.Context, ev *event) (decision, error) {
	inv := ev.Invoice
	if inv.SubscriptionID == "" {
		// no source subscription: never changes grace or billing status
		return processed(OutcomeIgnored), nil
	}
	tenant, err := p.tenantOf(ctx, ev.Customer)
	if err != nil {
		return decision{}, err
	}
	if tenant == "" {
		return withReason(ReasonCustomerNotLinked), nil
	}
	// the source must be a subscription persisted for this tenant, and not
	// conflict with its current eligible (nonterminal) subscription
	rows, err := p.tx.Query(ctx, `SELECT subscription_id, status FROM stripe_subscriptions WHERE tenant = $1`, tenant)
	if err != nil {
		return decision{}, err
	}
	var (
		anySub, found bool
		current       []string
	)
	for rows.Next() {
		var id, status string
		if err := rows.Scan(&id, &status); err != nil {
			rows.Close()
			return decision{}, err
		}
		anySub = true
		found = found || id == inv.SubscriptionID
		if !terminalSubscriptionStatus(status) {
			current = append(current, id)
		}
	}
	if err := rows.Err(); err != nil {
		return decision{}, err
	}
	if !anySub {
		return withReason(ReasonSubscriptionNotLinked), nil
	}
	if !found {
		return withReason(ReasonAmbiguousInvoiceSubscription), nil
	}
	for _, c := range current {
		if c != inv.SubscriptionID {
			return withReason(ReasonAmbiguousInvoiceSubscription), nil
		}
	}

	// invoice-level guard
	var (
		oldOutcome string
		oldCreated time.Time
	)
	err = p.tx.QueryRow(ctx, `SELECT outcome, last_event_created FROM stripe_invoices WHERE invoice_id = $1`, inv.ID).Scan(&oldOutcome, &oldCreated)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return decision{}, err
	case ev.Created.Before(oldCreated):
		return processed(OutcomeStale), nil
	case ev.Created.Equal(oldCreated):
		if oldOutcome == inv.Outcome {
			return processed(OutcomeUnchanged), nil
		}
		return withReason(ReasonAmbiguousInvoiceOrder), nil
	}

	// customer-level monotonic guard on the billing status
	var (
		custCreated *time.Time
		custEventID *string
		custStatus  *string
	)
	if err := p.tx.QueryRow(ctx, `
SELECT invoice_status_event_created, invoice_status_event_id, invoice_status
  FROM stripe_customer_links WHERE customer_id = $1`, ev.Customer).Scan(&custCreated, &custEventID, &custStatus); err != nil {
		return decision{}, err
	}
	changeStatus := true
	if custCreated != nil {
		switch {
		case ev.Created.Before(*custCreated):
			changeStatus = false
		case ev.Created.Equal(*custCreated) && deref(custStatus) != inv.Outcome:
			return withReason(ReasonAmbiguousInvoiceOrder), nil
		}
	}

	if _, err := p.tx.Exec(ctx, `
INSERT INTO stripe_invoices (invoice_id, customer_id, tenant, subscription_id, outcome, last_event_id, last_event_created, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT (invoice_id) DO UPDATE SET
    outcome = EXCLUDED.outcome, last_event_id = EXCLUDED.last_event_id,
    last_event_created = EXCLUDED.last_event_created, updated_at = EXCLUDED.updated_at`,
		inv.ID, ev.Customer, tenant, inv.SubscriptionID, inv.Outcome, ev.ID, ev.Created, p.now); err != nil {
		return decision{}, err
	}
	if !changeStatus {
		return processed(OutcomeStale), nil
	}
	if _, err := p.tx.Exec(ctx, `
UPDATE stripe_customer_links
   SET invoice_status_event_created = $2, invoice_status_event_id = $3, invoice_status = $4
 WHERE customer_id = $1`, ev.Customer, ev.Created, ev.ID, inv.Outcome); err != nil {
		return decision{}, err
	}
	billing, grace := "current", (*time.Time)(nil)
	if inv.Outcome == invoiceFailed {
		g := ev.Created.Add(GracePeriod)
		billing, grace = "grace", &g
	}
	if _, err := p.tx.Exec(ctx, `
INSERT INTO tenant_entitlements (tenant, customer_id, billing_status, grace_until, updated_at)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (tenant) DO UPDATE SET
    billing_status = EXCLUDED.billing_status, grace_until = EXCLUDED.grace_until, updated_at = EXCLUDED.updated_at`,
		tenant, ev.Customer, billing, grace, p.now); err != nil {
		return decision{}, err
	}
	return processed(OutcomeApplied), nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func sameTime(a, b *time.Time) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return a.Equal(*b)
}
