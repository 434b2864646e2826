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

// errCustomerBusy: the customer's advisory lock is held by another
// transaction; the event is skipped this pass.
var errCustomerBusy = errors.New("inbox: customer locked elsewhere")

// projector applies one event inside the event's transaction. Each
// projection is one round trip that takes the customer's advisory lock and
// then reads the state it decides on (two statements, each with a fresh
// READ COMMITTED snapshot, so the read sees everything committed by the
// lock's previous holder), a decision in Go, and its writes queued in
// writes, sent with the row's settlement as one pipelined batch.
type projector struct {
	tx     batchSender
	now    time.Time
	writes *pgx.Batch
}

// batchSender is the pinned connection (or pgx.Tx) the projector runs on.
type batchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

func (p *projector) project(ctx context.Context, ev *event) (decision, error) {
	switch ev.Kind {
	case kindCheckout:
		return p.checkout(ctx, ev)
	case kindSubscription:
		return p.subscription(ctx, ev)
	case kindInvoice:
		return p.invoice(ctx, ev)
	case kindOther:
		if ev.Customer != "" {
			if err := p.lockAndLoad(ctx, ev.Customer, "", nil, nil); err != nil {
				return decision{}, err
			}
		}
		return processed(OutcomeIgnored), nil
	default:
		return decision{}, errors.New("inbox: unknown event kind")
	}
}

// lockAndLoad takes the customer's transaction-scoped advisory lock without
// blocking (errCustomerBusy when held elsewhere) and, in the same round
// trip, runs the load query and scans its single row.
func (p *projector) lockAndLoad(ctx context.Context, customer, sql string, args []any, scan func(pgx.Row) error) error {
	b := &pgx.Batch{}
	b.Queue(sqlLockCustomer, customer)
	if sql != "" {
		b.Queue(sql, args...)
	}
	br := p.tx.SendBatch(ctx, b)
	var locked bool
	if err := br.QueryRow().Scan(&locked); err != nil {
		br.Close()
		return err
	}
	if !locked {
		br.Close()
		return errCustomerBusy
	}
	if sql != "" {
		if err := scan(br.QueryRow()); err != nil {
			br.Close()
			return err
		}
	}
	return br.Close()
}

const sqlLoadCheckout = `
SELECT (SELECT tenant FROM stripe_customer_links WHERE customer_id = $1),
       (SELECT customer_id FROM stripe_customer_links WHERE tenant = $2),
       EXISTS (SELECT 1 FROM stripe_subscriptions
                WHERE tenant = $2 AND subscription_id <> $3 AND $3 <> ''
                  AND status NOT IN ('canceled', 'incomplete_expired'))`

// checkout links the session's customer to its tenant and wakes the
// customer's postponed events (seed 003).
func (p *projector) checkout(ctx context.Context, ev *event) (decision, error) {
	co := ev.Checkout
	if ev.Customer == "" || co.Tenant == "" {
		if co.Mode == "subscription" {
			// a subscription checkout we cannot attribute: an operator decides
			return withReason(ReasonUnrecognizedStripePayload), nil
		}
		return processed(OutcomeIgnored), nil // a one-off payment, not a tenant's plan
	}
	var (
		linkedTenant, tenantCustomer *string
		competing                    bool
	)
	if err := p.lockAndLoad(ctx, ev.Customer, sqlLoadCheckout, []any{ev.Customer, co.Tenant, co.SubscriptionID}, func(r pgx.Row) error {
		return r.Scan(&linkedTenant, &tenantCustomer, &competing)
	}); err != nil {
		return decision{}, err
	}
	switch {
	case linkedTenant != nil && *linkedTenant != co.Tenant:
		return withReason(ReasonAmbiguousCustomerLinkage), nil // customer → second tenant
	case tenantCustomer != nil && *tenantCustomer != ev.Customer:
		return withReason(ReasonAmbiguousCustomerLinkage), nil // tenant → another customer
	case competing:
		return withReason(ReasonAmbiguousMultiSubscription), nil
	}
	outcome := OutcomeUnchanged // identical tenant/customer replay
	if linkedTenant == nil {
		// A plain INSERT: a concurrent checkout linking the same tenant to
		// another customer (the customer lock does not cover the tenant)
		// fails the batch; the retry then sees the link and quarantines.
		p.writes.Queue(`INSERT INTO stripe_customer_links (customer_id, tenant, linked_by_event, linked_at) VALUES ($1, $2, $3, $4)`,
			ev.Customer, co.Tenant, ev.ID, p.now)
		p.writes.Queue(`INSERT INTO tenant_entitlements (tenant, customer_id, updated_at) VALUES ($1, $2, $3) ON CONFLICT (tenant) DO NOTHING`,
			co.Tenant, ev.Customer, p.now)
		outcome = OutcomeApplied
	}
	// wake the customer's pending rows now; revive its customer_not_linked
	// dead letters with a fresh budget. Unrelated dead letters stay.
	p.writes.Queue(`
UPDATE billing_events
   SET next_attempt_at = $2,
       attempts = CASE WHEN last_reason = 'customer_not_linked' THEN 0 ELSE attempts END
 WHERE customer_id = $1 AND processed_at IS NULL AND dead_letter_at IS NULL AND event_id <> $3`,
		ev.Customer, p.now, ev.ID)
	p.writes.Queue(`
UPDATE billing_events
   SET dead_letter_at = NULL, attempts = 0, next_attempt_at = $2
 WHERE customer_id = $1 AND processed_at IS NULL AND dead_letter_at IS NOT NULL
   AND last_reason = 'customer_not_linked'`, ev.Customer, p.now)
	return processed(outcome), nil
}

const sqlLoadSubscription = `
SELECT l.tenant,
       EXISTS (SELECT 1 FROM stripe_subscriptions o
                WHERE o.tenant = l.tenant AND o.subscription_id <> $2
                  AND o.status NOT IN ('canceled', 'incomplete_expired')),
       s.tenant, s.status, s.price_id, s.current_period_end, s.cancel_at_period_end, s.last_event_created,
       ARRAY(SELECT price_id FROM stripe_price_plans WHERE price_id = ANY($3) ORDER BY price_id),
       ARRAY(SELECT plan FROM stripe_price_plans WHERE price_id = ANY($3) ORDER BY price_id),
       EXISTS (SELECT 1 FROM stripe_price_plans)
  FROM (SELECT 1) AS one
  LEFT JOIN stripe_customer_links l ON l.customer_id = $1
  LEFT JOIN stripe_subscriptions s ON s.subscription_id = $2`

// subscription applies a customer.subscription.* snapshot under the
// subscription timestamp guard (seed 003).
func (p *projector) subscription(ctx context.Context, ev *event) (decision, error) {
	sub := ev.Subscription
	var (
		tenant, oldTenant, oldStatus, oldPrice *string
		competing, oldCancel, anyMapping       bool
		oldPeriodEnd, oldCreated               *time.Time
		mappedPrices, mappedPlans              []string
	)
	prices := sub.PriceIDs
	if prices == nil {
		prices = []string{}
	}
	if err := p.lockAndLoad(ctx, ev.Customer, sqlLoadSubscription, []any{ev.Customer, sub.ID, prices}, func(r pgx.Row) error {
		var cancel *bool
		err := r.Scan(&tenant, &competing, &oldTenant, &oldStatus, &oldPrice, &oldPeriodEnd, &cancel, &oldCreated,
			&mappedPrices, &mappedPlans, &anyMapping)
		oldCancel = cancel != nil && *cancel
		return err
	}); err != nil {
		return decision{}, err
	}
	if tenant == nil {
		return withReason(ReasonCustomerNotLinked), nil
	}
	if competing {
		return withReason(ReasonAmbiguousMultiSubscription), nil
	}
	var price string
	if len(sub.PriceIDs) > 0 {
		price = sub.PriceIDs[0]
	}
	if oldCreated != nil {
		if deref(oldTenant) != *tenant {
			return withReason(ReasonAmbiguousCustomerLinkage), nil
		}
		switch {
		case ev.Created.Before(*oldCreated):
			return processed(OutcomeStale), nil
		case ev.Created.Equal(*oldCreated):
			if deref(oldStatus) == sub.Status && deref(oldPrice) == price && oldCancel == sub.CancelAtPeriodEnd &&
				sameTime(oldPeriodEnd, sub.CurrentPeriodEnd) {
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
		plans := make(map[string]string, len(mappedPrices))
		for i := range mappedPrices {
			plans[mappedPrices[i]] = mappedPlans[i]
		}
		for _, pr := range sub.PriceIDs {
			if _, ok := plans[pr]; !ok {
				if !anyMapping {
					return withReason(ReasonStripePriceConfigMissing), nil
				}
				return withReason(ReasonUnmappedStripePrice), nil
			}
		}
		pl := plans[price] // every price mapped; the first item's plan is the tenant's
		plan = &pl
	}
	p.writes.Queue(`
INSERT INTO stripe_subscriptions (subscription_id, customer_id, tenant, status, price_id, plan, current_period_end,
                                  cancel_at_period_end, last_event_id, last_event_created, updated_at)
VALUES ($1, $2, $3, $4, NULLIF($5, ''), $6, $7, $8, $9, $10, $11)
ON CONFLICT (subscription_id) DO UPDATE SET
    status = EXCLUDED.status, price_id = EXCLUDED.price_id, plan = EXCLUDED.plan,
    current_period_end = EXCLUDED.current_period_end, cancel_at_period_end = EXCLUDED.cancel_at_period_end,
    last_event_id = EXCLUDED.last_event_id, last_event_created = EXCLUDED.last_event_created,
    updated_at = EXCLUDED.updated_at`,
		sub.ID, ev.Customer, *tenant, sub.Status, price, plan, sub.CurrentPeriodEnd, sub.CancelAtPeriodEnd,
		ev.ID, ev.Created, p.now)
	// the plan follows the subscription; billing status is the invoices'
	// alone, so an earlier subscription never undoes a later invoice status
	var granted *string
	if entitledSubscriptionStatus(sub.Status) {
		granted = plan
	}
	p.writes.Queue(`
INSERT INTO tenant_entitlements (tenant, customer_id, subscription_id, subscription_status, plan, updated_at)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (tenant) DO UPDATE SET
    subscription_id = EXCLUDED.subscription_id, subscription_status = EXCLUDED.subscription_status,
    plan = EXCLUDED.plan, updated_at = EXCLUDED.updated_at`,
		*tenant, ev.Customer, sub.ID, sub.Status, granted, p.now)
	return processed(OutcomeApplied), nil
}

const sqlLoadInvoice = `
SELECT l.tenant, l.invoice_status_event_created, l.invoice_status,
       ARRAY(SELECT subscription_id FROM stripe_subscriptions WHERE tenant = l.tenant),
       ARRAY(SELECT subscription_id FROM stripe_subscriptions
              WHERE tenant = l.tenant AND status NOT IN ('canceled', 'incomplete_expired')),
       i.outcome, i.last_event_created
  FROM (SELECT 1) AS one
  LEFT JOIN stripe_customer_links l ON l.customer_id = $1
  LEFT JOIN stripe_invoices i ON i.invoice_id = $2`

// invoice applies invoice.paid / invoice.payment_succeeded /
// invoice.payment_failed under the invoice guard and the separate
// customer-level guard (seed 003).
func (p *projector) invoice(ctx context.Context, ev *event) (decision, error) {
	inv := ev.Invoice
	var (
		tenant, custStatus, oldOutcome *string
		custCreated, oldCreated        *time.Time
		subs, current                  []string
	)
	if err := p.lockAndLoad(ctx, ev.Customer, sqlLoadInvoice, []any{ev.Customer, inv.ID}, func(r pgx.Row) error {
		return r.Scan(&tenant, &custCreated, &custStatus, &subs, &current, &oldOutcome, &oldCreated)
	}); err != nil {
		return decision{}, err
	}
	if inv.SubscriptionID == "" {
		// no source subscription: never changes grace or billing status
		return processed(OutcomeIgnored), nil
	}
	if tenant == nil {
		return withReason(ReasonCustomerNotLinked), nil
	}
	// the source must be a subscription persisted for this tenant, and not
	// conflict with its current eligible (nonterminal) subscription
	if len(subs) == 0 {
		return withReason(ReasonSubscriptionNotLinked), nil
	}
	found := false
	for _, s := range subs {
		found = found || s == inv.SubscriptionID
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
	if oldCreated != nil {
		switch {
		case ev.Created.Before(*oldCreated):
			return processed(OutcomeStale), nil
		case ev.Created.Equal(*oldCreated):
			if deref(oldOutcome) == inv.Outcome {
				return processed(OutcomeUnchanged), nil
			}
			return withReason(ReasonAmbiguousInvoiceOrder), nil
		}
	}
	// customer-level monotonic guard on the billing status
	changeStatus := true
	if custCreated != nil {
		switch {
		case ev.Created.Before(*custCreated):
			changeStatus = false
		case ev.Created.Equal(*custCreated) && deref(custStatus) != inv.Outcome:
			return withReason(ReasonAmbiguousInvoiceOrder), nil
		}
	}
	p.writes.Queue(`
INSERT INTO stripe_invoices (invoice_id, customer_id, tenant, subscription_id, outcome, last_event_id, last_event_created, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT (invoice_id) DO UPDATE SET
    outcome = EXCLUDED.outcome, last_event_id = EXCLUDED.last_event_id,
    last_event_created = EXCLUDED.last_event_created, updated_at = EXCLUDED.updated_at`,
		inv.ID, ev.Customer, *tenant, inv.SubscriptionID, inv.Outcome, ev.ID, ev.Created, p.now)
	if !changeStatus {
		return processed(OutcomeStale), nil // recorded; the later status stands
	}
	p.writes.Queue(`
UPDATE stripe_customer_links
   SET invoice_status_event_created = $2, invoice_status_event_id = $3, invoice_status = $4
 WHERE customer_id = $1`, ev.Customer, ev.Created, ev.ID, inv.Outcome)
	billing, grace := "current", (*time.Time)(nil)
	if inv.Outcome == invoiceFailed {
		g := ev.Created.Add(GracePeriod)
		billing, grace = "grace", &g
	}
	p.writes.Queue(`
INSERT INTO tenant_entitlements (tenant, customer_id, billing_status, grace_until, updated_at)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (tenant) DO UPDATE SET
    billing_status = EXCLUDED.billing_status, grace_until = EXCLUDED.grace_until, updated_at = EXCLUDED.updated_at`,
		*tenant, ev.Customer, billing, grace, p.now)
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
