package outbox

import "fmt"

// State is an item's state. The same seven values are a CHECK constraint on
// outbox_items.state (seed 000, "The states").
type State string

const (
	// StatePending: staged, waiting for a worker. In: Stage, a retryable
	// failure (deliverer), an operator requeue from quarantined. Out: a
	// deliverer claim.
	StatePending State = "pending"
	// StateLeased: a deliverer claimed it (lease_token incremented). Out:
	// every outcome, each fenced by lease_token; or a new claim once
	// lease_expires_at has passed.
	StateLeased State = "leased"
	// StateAccepted: the provider took it (deliverer), or an operator
	// acknowledged it with evidence. Out: the reconciler, to confirmed.
	StateAccepted State = "accepted"
	// StateConfirmed: the reconciler has seen the provider's own evidence.
	// Terminal.
	StateConfirmed State = "confirmed"
	// StateUncertain: nobody knows whether it landed (uncertain answer,
	// attempts exhausted, horizon passed). Nothing automatic moves it; an
	// operator acknowledges or abandons it.
	StateUncertain State = "uncertain"
	// StateRejected: the provider refused it, or an operator decided it
	// never landed. Terminal; nothing automatic leaves it.
	StateRejected State = "rejected"
	// StateQuarantined: it cannot be sent as it stands; the reason is on the
	// row. Never retried; an operator requeues it after fixing the cause.
	StateQuarantined State = "quarantined"
)

// States lists all seven states in the order of the seed's table.
var States = []State{StatePending, StateLeased, StateAccepted, StateConfirmed, StateUncertain, StateRejected, StateQuarantined}

// Valid reports whether s is one of the seven states.
func (s State) Valid() bool {
	switch s {
	case StatePending, StateLeased, StateAccepted, StateConfirmed, StateUncertain, StateRejected, StateQuarantined:
		return true
	default:
		return false
	}
}

// Terminal reports whether nothing automatic ever moves an item out of s.
// Uncertain counts: only an operator moves it.
func (s State) Terminal() bool {
	switch s {
	case StateAccepted, StateConfirmed, StateUncertain, StateRejected, StateQuarantined:
		return true
	case StatePending, StateLeased:
		return false
	default:
		panic(fmt.Sprintf("outbox: unknown state %q", string(s)))
	}
}

// Reason is why an item is quarantined (seed 000, "Quarantine"). Stored in
// outbox_items.quarantine_reason.
type Reason string

const (
	// ReasonFeatureUnmapped: no meter mapping for the item's feature on its
	// destination account.
	ReasonFeatureUnmapped Reason = "feature_unmapped"
	// ReasonCustomerMissing: the tenant has no Stripe customer on the account.
	ReasonCustomerMissing Reason = "customer_missing"
	// ReasonAccountUnconfirmed: the destination account is unknown or not
	// confirmed, or Stripe answered 401/403 for it.
	ReasonAccountUnconfirmed Reason = "account_unconfirmed"
	// ReasonModeMismatch: the item's mode differs from the account's or the
	// deliverer's API key's mode.
	ReasonModeMismatch Reason = "mode_mismatch"
	// ReasonPeriodBuffered: an event for a period that belongs to the
	// buffered era (before the cutover watermark).
	ReasonPeriodBuffered Reason = "period_buffered"
	// ReasonTimestampOutsideWindow: the item's timestamp is older than
	// Stripe's 35-day window or more than 5 minutes ahead, at send time.
	ReasonTimestampOutsideWindow Reason = "timestamp_outside_window"
	// ReasonProviderConfiguration: Stripe refused the request naming a
	// configuration cause (e.g. no such meter or customer).
	ReasonProviderConfiguration Reason = "provider_configuration"
	// ReasonNegativeQuantity: a correction with a negative quantity. Stripe
	// meter events cannot carry negative values; the deliverer quarantines
	// it rather than send a wrong positive or drop it (docs/deliverer.md).
	ReasonNegativeQuantity Reason = "negative_quantity"
)

// Reasons lists every quarantine reason.
var Reasons = []Reason{ReasonFeatureUnmapped, ReasonCustomerMissing, ReasonAccountUnconfirmed, ReasonModeMismatch, ReasonPeriodBuffered, ReasonTimestampOutsideWindow, ReasonProviderConfiguration, ReasonNegativeQuantity}

// Valid reports whether r is a known reason.
func (r Reason) Valid() bool {
	for _, x := range Reasons {
		if r == x {
			return true
		}
	}
	return false
}
