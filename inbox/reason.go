package inbox

import "fmt"

// Reason is the code recorded on a billing_events row (last_reason) when the
// worker defers or quarantines it. Every reason code of seed 003 is one
// constant; ReasonProjectionFailed is ours, for a failed SQL projection.
type Reason string

const (
	// ReasonCustomerNotLinked: a subscription or invoice event names a Stripe
	// customer no checkout has linked to a tenant yet. Deferred (first by
	// 60 s, the seed's postponement), woken at once when a checkout links the
	// customer; dead letter after MaxAttempts. A linkage also revives this
	// customer's dead letters with this reason and resets their budget.
	ReasonCustomerNotLinked Reason = "customer_not_linked"
	// ReasonSubscriptionNotLinked: an invoice names its source subscription
	// but the tenant has no subscription recorded yet. Deferred; never
	// granted on customer identity alone (seed 003).
	ReasonSubscriptionNotLinked Reason = "subscription_not_linked"
	// ReasonUnmappedStripePrice: a subscription's price is not in
	// stripe_price_plans. Deferred; after MaxAttempts a dead letter that only
	// an operator requeue replays (a mapping fix alone does not).
	ReasonUnmappedStripePrice Reason = "unmapped_stripe_price"
	// ReasonStripePriceConfigMissing: stripe_price_plans is empty, so no
	// price can be mapped at all. Deferred like ReasonUnmappedStripePrice.
	ReasonStripePriceConfigMissing Reason = "stripe_price_config_missing"
	// ReasonUnrecognizedStripePayload: the stored event (envelope or object)
	// is invalid: not JSON, missing or mistyped fields, invalid tenant
	// metadata, or an invoice whose two subscription references contradict
	// each other. Quarantined immediately.
	ReasonUnrecognizedStripePayload Reason = "unrecognized_stripe_payload"
	// ReasonInvalidInvoiceAmount: an invoice event's amount (amount_paid of
	// a paid invoice, amount_due of a failed one) is present but not a
	// non-negative integer in the currency's minor unit (negative, a
	// string, null, a fraction or exponent, beyond int64), or its currency
	// is present but not a string of three letters (an amount in minor units
	// means nothing without it). Quarantined immediately: the outcome is
	// neither projected nor announced without its amount and currency.
	ReasonInvalidInvoiceAmount Reason = "invalid_invoice_amount"
	// ReasonAmbiguousInvoiceOrder: opposite invoice outcomes (paid vs
	// failed) of one customer in the same Stripe second, of one invoice or
	// against the customer-level status. Every invoice outcome of the
	// customer in that second is quarantined in one ambiguity and their
	// effect undone (ambiguity.go), whichever arrived first.
	ReasonAmbiguousInvoiceOrder Reason = "ambiguous_invoice_order"
	// ReasonAmbiguousSubscriptionOrder: two different snapshots of one
	// subscription in the same Stripe second. Both are quarantined in one
	// ambiguity and the subscription restored to what came before that
	// second (ambiguity.go), whichever arrived first.
	ReasonAmbiguousSubscriptionOrder Reason = "ambiguous_subscription_order"
	// ReasonAmbiguousMultiSubscription: the linked tenant already has another
	// nonterminal subscription. Quarantined before any mutation.
	ReasonAmbiguousMultiSubscription Reason = "ambiguous_multi_subscription"
	// ReasonAmbiguousInvoiceSubscription: an invoice's source subscription is
	// not one persisted for the tenant, or conflicts with the tenant's
	// current eligible subscription. Quarantined.
	ReasonAmbiguousInvoiceSubscription Reason = "ambiguous_invoice_subscription"
	// ReasonAmbiguousCustomerLinkage: a checkout would rebind a tenant to
	// another customer or a customer to another tenant. Quarantined.
	ReasonAmbiguousCustomerLinkage Reason = "ambiguous_customer_linkage"
	// ReasonProjectionFailed: the projection's SQL failed and rolled back;
	// the attempt counts against the budget (seed 003: "Twelve attempts
	// (including earlier SQL failures)").
	ReasonProjectionFailed Reason = "projection_failed"
)

// Reasons lists every reason, deferrals first.
var Reasons = []Reason{
	ReasonCustomerNotLinked, ReasonSubscriptionNotLinked, ReasonUnmappedStripePrice, ReasonStripePriceConfigMissing,
	ReasonProjectionFailed,
	ReasonUnrecognizedStripePayload, ReasonInvalidInvoiceAmount, ReasonAmbiguousInvoiceOrder, ReasonAmbiguousSubscriptionOrder,
	ReasonAmbiguousMultiSubscription, ReasonAmbiguousInvoiceSubscription, ReasonAmbiguousCustomerLinkage,
}

// Deferred reports whether r is retried within the attempt budget (true) or
// quarantined immediately (false).
func (r Reason) Deferred() bool {
	switch r {
	case ReasonCustomerNotLinked, ReasonSubscriptionNotLinked, ReasonUnmappedStripePrice,
		ReasonStripePriceConfigMissing, ReasonProjectionFailed:
		return true
	case ReasonUnrecognizedStripePayload, ReasonInvalidInvoiceAmount, ReasonAmbiguousInvoiceOrder, ReasonAmbiguousSubscriptionOrder,
		ReasonAmbiguousMultiSubscription, ReasonAmbiguousInvoiceSubscription, ReasonAmbiguousCustomerLinkage:
		return false
	default:
		panic(fmt.Sprintf("inbox: unknown reason %q", string(r)))
	}
}

// Outcome is how a processed event ended (billing_events.outcome).
type Outcome string

const (
	// OutcomeApplied: the projection changed.
	OutcomeApplied Outcome = "applied"
	// OutcomeStale: older than a guard (the subscription's, the invoice's
	// or the customer-level invoice guard); recorded, the newer state kept.
	OutcomeStale Outcome = "stale"
	// OutcomeUnchanged: the same state again (an identical linkage replay,
	// an identical same-second snapshot).
	OutcomeUnchanged Outcome = "unchanged"
	// OutcomeIgnored: nothing to project: an event type the inbox does not
	// project, an invoice without a source subscription, a non-subscription
	// checkout without customer or tenant.
	OutcomeIgnored Outcome = "ignored"
)

// MaxAttempts is the durable attempt budget: the twelfth counted attempt
// (deferral or failed projection) quarantines the event (seed 003).
const MaxAttempts = 12

// Backoff bounds (seed 003: "exponential delays from 60 seconds up to one
// hour"). The first deferral of an event preceding checkout is the seed's
// 60 s postponement.
const (
	BackoffBase = 60   // seconds
	BackoffCap  = 3600 // seconds
)

// BackoffSeconds returns the delay in seconds after the attempt-th counted
// attempt (1-based): 60, 120, 240, …, capped at 3600.
func BackoffSeconds(attempt int) int {
	if attempt < 1 {
		attempt = 1
	}
	d := BackoffBase
	for i := 1; i < attempt; i++ {
		d *= 2
		if d >= BackoffCap {
			return BackoffCap
		}
	}
	return d
}
