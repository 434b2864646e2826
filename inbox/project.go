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
       s.tenant, s.status, s.price_id, s.plan, s.current_period_end, s.cancel_at_period_end,
       s.last_event_id, s.last_event_created,
       ARRAY(SELECT price_id FROM stripe_price_plans WHERE price_id = ANY($3) ORDER BY price_id),
       ARRAY(SELECT plan FROM stripe_price_plans WHERE price_id = ANY($3) ORDER BY price_id),
       EXISTS (SELECT 1 FROM stripe_price_plans),
       e.subscription_id, e.subscription_status, e.plan,
       (SELECT status FROM billing_ambiguities
         WHERE kind = 'subscription' AND subject_id = $2 AND event_second = $4)
  FROM (SELECT 1) AS one
  LEFT JOIN stripe_customer_links l ON l.customer_id = $1
  LEFT JOIN stripe_subscriptions s ON s.subscription_id = $2
  LEFT JOIN tenant_entitlements e ON e.tenant = l.tenant`

// subscription applies a customer.subscription.* snapshot under the
// subscription timestamp guard (seed 003). A different state in the same
// Stripe second as the applied one opens an ambiguity (ambiguity.go)
// instead of keeping whichever arrived first.
func (p *projector) subscription(ctx context.Context, ev *event) (decision, error) {
	sub := ev.Subscription
	var (
		tenant, oldTenant, oldStatus, oldPrice, oldPlan, oldEventID *string
		entSub, entStatus, entPlan, ambStatus                       *string
		competing, oldCancel, anyMapping                            bool
		oldPeriodEnd, oldCreated                                    *time.Time
		mappedPrices, mappedPlans                                   []string
	)
	prices := sub.PriceIDs
	if prices == nil {
		prices = []string{}
	}
	if err := p.lockAndLoad(ctx, ev.Customer, sqlLoadSubscription, []any{ev.Customer, sub.ID, prices, ev.Created}, func(r pgx.Row) error {
		var cancel *bool
		err := r.Scan(&tenant, &competing, &oldTenant, &oldStatus, &oldPrice, &oldPlan, &oldPeriodEnd, &cancel,
			&oldEventID, &oldCreated, &mappedPrices, &mappedPlans, &anyMapping, &entSub, &entStatus, &entPlan, &ambStatus)
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
	key := ambiguityKey{kind: ambiguitySubscription, subject: sub.ID, customer: ev.Customer, tenant: *tenant, second: ev.Created}
	if oldCreated != nil {
		if deref(oldTenant) != *tenant {
			return withReason(ReasonAmbiguousCustomerLinkage), nil
		}
		if ev.Created.Before(*oldCreated) {
			return processed(OutcomeStale), nil
		}
	}
	switch deref(ambStatus) {
	case ambiguityOpen:
		return p.joinAmbiguity(key, ev), nil
	case ambiguityResolved:
		return processed(OutcomeStale), nil // the resolution decided this second
	}
	if oldCreated != nil && ev.Created.Equal(*oldCreated) {
		if deref(oldStatus) == sub.Status && deref(oldPrice) == price && oldCancel == sub.CancelAtPeriodEnd &&
			sameTime(oldPeriodEnd, sub.CurrentPeriodEnd) {
			return processed(OutcomeUnchanged), nil
		}
		return p.openAmbiguity(ctx, key, ev)
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
	prior := subscriptionPrior{Entitlement: entitlementSubscription{SubscriptionID: entSub, SubscriptionStatus: entStatus, Plan: entPlan}}
	if oldCreated != nil {
		prior.Row = &subscriptionRow{Status: deref(oldStatus), PriceID: oldPrice, Plan: oldPlan, CurrentPeriodEnd: oldPeriodEnd,
			CancelAtPeriodEnd: oldCancel, LastEventID: deref(oldEventID), LastEventCreated: *oldCreated}
	}
	var granted *string
	if entitledSubscriptionStatus(sub.Status) {
		granted = plan
	}
	p.queueSubscription(subscriptionWrite{ID: sub.ID, Customer: ev.Customer, Tenant: *tenant, Status: sub.Status, Price: price, Plan: plan,
		Granted: granted, CurrentPeriodEnd: sub.CurrentPeriodEnd, CancelAtPeriodEnd: sub.CancelAtPeriodEnd,
		EventID: ev.ID, Created: ev.Created, Prior: prior})
	changed := SubscriptionChanged{Tenant: *tenant, SubscriptionID: sub.ID, Status: sub.Status, Plan: plan,
		CurrentPeriodEnd: sub.CurrentPeriodEnd, CancelAtPeriodEnd: sub.CancelAtPeriodEnd, StripeEventID: ev.ID, StripeEventCreated: ev.Created}
	if prior.Row != nil {
		changed.PreviousStatus, changed.PreviousPlan = oldStatus, oldPlan
	}
	if err := p.announce(EventSubscriptionChanged, sub.ID, changed, ev.ID); err != nil {
		return decision{}, err
	}
	if deref(entSub) != sub.ID || deref(entStatus) != sub.Status || !strPtrEqual(entPlan, granted) {
		if err := p.announce(EventEntitlementChanged, *tenant, EntitlementChanged{Tenant: *tenant, Cause: "subscription",
			SubscriptionID: sub.ID, SubscriptionStatus: sub.Status, Plan: granted, PreviousPlan: entPlan,
			StripeEventID: ev.ID, StripeEventCreated: ev.Created}, ev.ID); err != nil {
			return decision{}, err
		}
	}
	return processed(OutcomeApplied), nil
}

// subscriptionWrite is one subscription snapshot to store, with the
// entitlement it grants and what both were before its second.
type subscriptionWrite struct {
	ID, Customer, Tenant, Status, Price string
	Plan, Granted                       *string
	CurrentPeriodEnd                    *time.Time
	CancelAtPeriodEnd                   bool
	EventID                             string
	Created                             time.Time
	Prior                               subscriptionPrior
}

// queueSubscription queues the subscription row and the entitlement's
// subscription columns. The plan follows the subscription; billing status
// is the invoices' alone, so an earlier subscription never undoes a later
// invoice status.
func (p *projector) queueSubscription(w subscriptionWrite) {
	p.writes.Queue(`
INSERT INTO stripe_subscriptions (subscription_id, customer_id, tenant, status, price_id, plan, current_period_end,
                                  cancel_at_period_end, last_event_id, last_event_created, updated_at, prior)
VALUES ($1, $2, $3, $4, NULLIF($5, ''), $6, $7, $8, $9, $10, $11, $12::jsonb)
ON CONFLICT (subscription_id) DO UPDATE SET
    status = EXCLUDED.status, price_id = EXCLUDED.price_id, plan = EXCLUDED.plan,
    current_period_end = EXCLUDED.current_period_end, cancel_at_period_end = EXCLUDED.cancel_at_period_end,
    last_event_id = EXCLUDED.last_event_id, last_event_created = EXCLUDED.last_event_created,
    updated_at = EXCLUDED.updated_at, prior = EXCLUDED.prior`,
		w.ID, w.Customer, w.Tenant, w.Status, w.Price, w.Plan, w.CurrentPeriodEnd, w.CancelAtPeriodEnd,
		w.EventID, w.Created, p.now, mustJSON(w.Prior))
	p.writes.Queue(`
INSERT INTO tenant_entitlements (tenant, customer_id, subscription_id, subscription_status, plan, updated_at)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (tenant) DO UPDATE SET
    subscription_id = EXCLUDED.subscription_id, subscription_status = EXCLUDED.subscription_status,
    plan = EXCLUDED.plan, updated_at = EXCLUDED.updated_at`,
		w.Tenant, w.Customer, w.ID, w.Status, w.Granted, p.now)
}

const sqlLoadInvoice = `
SELECT l.tenant, l.invoice_status_event_created, l.invoice_status, l.invoice_status_event_id,
       ARRAY(SELECT subscription_id FROM stripe_subscriptions WHERE tenant = l.tenant),
       ARRAY(SELECT subscription_id FROM stripe_subscriptions
              WHERE tenant = l.tenant AND status NOT IN ('canceled', 'incomplete_expired')),
       i.outcome, i.last_event_id, i.last_event_created,
       e.billing_status, e.grace_until,
       (SELECT status FROM billing_ambiguities
         WHERE kind = 'invoice' AND subject_id = $1 AND event_second = $3)
  FROM (SELECT 1) AS one
  LEFT JOIN stripe_customer_links l ON l.customer_id = $1
  LEFT JOIN stripe_invoices i ON i.invoice_id = $2
  LEFT JOIN tenant_entitlements e ON e.tenant = l.tenant`

// invoice applies invoice.paid / invoice.payment_succeeded /
// invoice.payment_failed under the invoice guard and the separate
// customer-level guard (seed 003). An opposite outcome in the same Stripe
// second, of the same invoice or of the customer's latest status, opens an
// ambiguity over every invoice outcome of the customer in that second
// (ambiguity.go) instead of keeping whichever arrived first.
func (p *projector) invoice(ctx context.Context, ev *event) (decision, error) {
	inv := ev.Invoice
	var (
		tenant, custStatus, custEventID, oldOutcome, oldEventID *string
		billing, ambStatus                                      *string
		custCreated, oldCreated, graceUntil                     *time.Time
		subs, current                                           []string
	)
	if err := p.lockAndLoad(ctx, ev.Customer, sqlLoadInvoice, []any{ev.Customer, inv.ID, ev.Created}, func(r pgx.Row) error {
		return r.Scan(&tenant, &custCreated, &custStatus, &custEventID, &subs, &current, &oldOutcome, &oldEventID, &oldCreated,
			&billing, &graceUntil, &ambStatus)
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
	key := ambiguityKey{kind: ambiguityInvoice, subject: ev.Customer, customer: ev.Customer, tenant: *tenant, second: ev.Created}
	// invoice-level guard
	if oldCreated != nil && ev.Created.Before(*oldCreated) {
		return processed(OutcomeStale), nil
	}
	switch deref(ambStatus) {
	case ambiguityOpen:
		return p.joinAmbiguity(key, ev), nil
	case ambiguityResolved:
		return processed(OutcomeStale), nil // the resolution decided this second
	}
	if oldCreated != nil && ev.Created.Equal(*oldCreated) {
		if deref(oldOutcome) == inv.Outcome {
			return processed(OutcomeUnchanged), nil
		}
		return p.openAmbiguity(ctx, key, ev)
	}
	// customer-level monotonic guard on the billing status
	changeStatus := true
	if custCreated != nil {
		switch {
		case ev.Created.Before(*custCreated):
			changeStatus = false
		case ev.Created.Equal(*custCreated) && deref(custStatus) != inv.Outcome:
			return p.openAmbiguity(ctx, key, ev)
		}
	}
	invPrior := invoicePrior{}
	if oldCreated != nil {
		invPrior.Row = &invoiceRow{Outcome: deref(oldOutcome), LastEventID: deref(oldEventID), LastEventCreated: *oldCreated}
	}
	p.queueInvoice(inv.ID, ev.Customer, *tenant, inv.SubscriptionID, inv.Outcome, ev.ID, ev.Created, invPrior)
	announced := InvoiceOutcome{Tenant: *tenant, InvoiceID: inv.ID, SubscriptionID: inv.SubscriptionID, Amount: inv.Amount,
		Currency: inv.Currency, StripeEventID: ev.ID, StripeEventCreated: ev.Created}
	if inv.Outcome == invoiceFailed && changeStatus {
		g := ev.Created.Add(GracePeriod)
		announced.GraceUntil = &g
	}
	var aerr error
	if inv.Outcome == invoicePaid {
		aerr = p.announce(EventInvoicePaid, inv.ID, announced, inv.ID) // once per invoice
	} else {
		aerr = p.announce(EventInvoicePaymentFailed, inv.ID, announced, ev.ID)
	}
	if aerr != nil {
		return decision{}, aerr
	}
	if !changeStatus {
		return processed(OutcomeStale), nil // recorded; the later status stands
	}
	statusPrior := statusPrior{Entitlement: entitlementBilling{BillingStatus: deref(billing), GraceUntil: graceUntil}}
	if custCreated != nil {
		statusPrior.Status = &invoiceStatus{InvoiceStatus: deref(custStatus), EventID: deref(custEventID), EventCreated: *custCreated}
	}
	if statusPrior.Entitlement.BillingStatus == "" {
		statusPrior.Entitlement.BillingStatus = billingNone
	}
	p.queueStatus(ev.Customer, *tenant, inv.Outcome, ev.ID, ev.Created, statusPrior)
	newBilling := billingCurrent
	if inv.Outcome == invoiceFailed {
		newBilling = billingGrace
	}
	if newBilling != statusPrior.Entitlement.BillingStatus || announced.GraceUntil != nil {
		if err := p.announce(EventEntitlementChanged, *tenant, EntitlementChanged{Tenant: *tenant, Cause: "invoice",
			BillingStatus: newBilling, PreviousBillingStatus: statusPrior.Entitlement.BillingStatus, GraceUntil: announced.GraceUntil,
			StripeEventID: ev.ID, StripeEventCreated: ev.Created}, ev.ID); err != nil {
			return decision{}, err
		}
	}
	return processed(OutcomeApplied), nil
}

// queueInvoice queues an invoice row with what it was before this second.
func (p *projector) queueInvoice(id, customer, tenant, sub, outcome, eventID string, created time.Time, prior invoicePrior) {
	p.writes.Queue(`
INSERT INTO stripe_invoices (invoice_id, customer_id, tenant, subscription_id, outcome, last_event_id, last_event_created, updated_at, prior)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::jsonb)
ON CONFLICT (invoice_id) DO UPDATE SET
    outcome = EXCLUDED.outcome, last_event_id = EXCLUDED.last_event_id,
    last_event_created = EXCLUDED.last_event_created, updated_at = EXCLUDED.updated_at, prior = EXCLUDED.prior`,
		id, customer, tenant, sub, outcome, eventID, created, p.now, mustJSON(prior))
}

// queueStatus queues the customer-level invoice status and the tenant's
// billing status it decides: current after paid, grace until the failure's
// Stripe time + GracePeriod after failed. prior is kept only when the
// status moves to a new second (a same-second same-outcome replay keeps the
// prior of that second).
func (p *projector) queueStatus(customer, tenant, outcome, eventID string, created time.Time, prior statusPrior) {
	p.writes.Queue(`
UPDATE stripe_customer_links
   SET invoice_status_prior = CASE WHEN invoice_status_event_created IS DISTINCT FROM $2 THEN $5::jsonb ELSE invoice_status_prior END,
       invoice_status_event_created = $2, invoice_status_event_id = $3, invoice_status = $4
 WHERE customer_id = $1`, customer, created, eventID, outcome, mustJSON(prior))
	billing, grace := billingCurrent, (*time.Time)(nil)
	if outcome == invoiceFailed {
		g := created.Add(GracePeriod)
		billing, grace = billingGrace, &g
	}
	p.writes.Queue(`
INSERT INTO tenant_entitlements (tenant, customer_id, billing_status, grace_until, updated_at)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (tenant) DO UPDATE SET
    billing_status = EXCLUDED.billing_status, grace_until = EXCLUDED.grace_until, updated_at = EXCLUDED.updated_at`,
		tenant, customer, billing, grace, p.now)
}

// Billing statuses of tenant_entitlements.billing_status.
const (
	billingNone    = "none"
	billingCurrent = "current"
	billingGrace   = "grace"
)

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
