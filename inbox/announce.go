package inbox

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/aurora-billing/aurora/shared/events"
)

// Domain events the projections publish (shared/events), each queued in the
// projection's batch so it commits with the projection it announces; a
// deferral or quarantine drops the batch, and the announcement with it.
// docs/events.md lists the payloads.
const (
	// EventSubscriptionChanged: a subscription snapshot was applied.
	// Aggregate: the subscription id.
	EventSubscriptionChanged = "SubscriptionChanged.v1"
	// EventInvoicePaid: an invoice was recorded paid. Aggregate: the
	// invoice id. One per invoice (its id derives from the invoice), so
	// invoice.paid and invoice.payment_succeeded of one invoice announce it
	// once.
	EventInvoicePaid = "InvoicePaid.v1"
	// EventInvoicePaymentFailed: an invoice payment failure was recorded.
	// Aggregate: the invoice id. One per Stripe event (each failed attempt
	// is a fact).
	EventInvoicePaymentFailed = "InvoicePaymentFailed.v1"
	// EventEntitlementChanged: a tenant's entitlement changed (plan,
	// subscription or status, or billing status and grace), by a
	// projection, the opening of a same-second ambiguity (the restored
	// state; ambiguity.go) or its resolution. Aggregate: the tenant.
	EventEntitlementChanged = "EntitlementChanged.v1"
)

// idNamespace prefixes every derived event id of the inbox.
const idNamespace = "aurora.inbox"

// SubscriptionChanged is the payload of SubscriptionChanged.v1. Previous*
// are absent for a subscription seen for the first time.
type SubscriptionChanged struct {
	Tenant             string     `json:"tenant"`
	SubscriptionID     string     `json:"subscription_id"`
	Status             string     `json:"status"`
	PreviousStatus     *string    `json:"previous_status,omitempty"`
	Plan               *string    `json:"plan"`
	PreviousPlan       *string    `json:"previous_plan,omitempty"`
	CurrentPeriodEnd   *time.Time `json:"current_period_end,omitempty"`
	CancelAtPeriodEnd  bool       `json:"cancel_at_period_end"`
	StripeEventID      string     `json:"stripe_event_id"`
	StripeEventCreated time.Time  `json:"stripe_event_created"`
}

// InvoiceOutcome is the payload of InvoicePaid.v1 and
// InvoicePaymentFailed.v1. Amount is in the currency's minor unit
// (amount_paid for a paid invoice, amount_due for a failure); absent when
// the Stripe object carries none. GraceUntil: a failure's grace end, when
// it moved the tenant's billing status.
type InvoiceOutcome struct {
	Tenant             string     `json:"tenant"`
	InvoiceID          string     `json:"invoice_id"`
	SubscriptionID     string     `json:"subscription_id"`
	Amount             *int64     `json:"amount,omitempty"`
	Currency           string     `json:"currency,omitempty"`
	GraceUntil         *time.Time `json:"grace_until,omitempty"`
	StripeEventID      string     `json:"stripe_event_id"`
	StripeEventCreated time.Time  `json:"stripe_event_created"`
}

// EntitlementChanged is the payload of EntitlementChanged.v1. Cause is
// "subscription" (the subscription fields are set) or "invoice" (the
// billing fields are set).
type EntitlementChanged struct {
	Tenant                string     `json:"tenant"`
	Cause                 string     `json:"cause"`
	SubscriptionID        string     `json:"subscription_id,omitempty"`
	SubscriptionStatus    string     `json:"subscription_status,omitempty"`
	Plan                  *string    `json:"plan,omitempty"`
	PreviousPlan          *string    `json:"previous_plan,omitempty"`
	BillingStatus         string     `json:"billing_status,omitempty"`
	PreviousBillingStatus string     `json:"previous_billing_status,omitempty"`
	GraceUntil            *time.Time `json:"grace_until,omitempty"`
	StripeEventID         string     `json:"stripe_event_id"`
	StripeEventCreated    time.Time  `json:"stripe_event_created"`
}

// announce queues one domain event with the id derived from idParts (so a
// replay of the same fact is announced once: the insert is ON CONFLICT DO
// NOTHING). An event the events package refuses (an aggregate id out of
// its bounds) is an error of the projection: the row is retried and, after
// its budget, dead-lettered like any failing projection; nothing is
// dropped silently.
func (p *projector) announce(typ, aggregate string, payload any, idParts ...string) error {
	body, err := json.Marshal(payload)
	if err != nil {
		return fmt.Errorf("inbox: announce %s: %w", typ, err)
	}
	parts := append([]string{idNamespace, typ}, idParts...)
	if _, err := events.Queue(p.writes, events.Event{ID: events.IDFor(parts...), Type: typ, AggregateID: aggregate, Payload: body}); err != nil {
		return fmt.Errorf("inbox: announce %s: %w", typ, err)
	}
	return nil
}

func strPtrEqual(a, b *string) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return *a == *b
}
