package deliverer

import (
	"context"
	"fmt"
	"time"

	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/outbox"
)

// Outcome is what a provider answer means for an item. The values are the
// outcome column of outbox_attempts (migrations/sql/00001).
type Outcome string

const (
	// OutcomeAccepted: the provider took it (or already had it) → accepted.
	OutcomeAccepted Outcome = "accepted"
	// OutcomeRetry: retryable failure → pending with backoff, same key; or
	// uncertain once attempts reach the maximum.
	OutcomeRetry Outcome = "retry"
	// OutcomeUncertain: nobody knows whether it landed → uncertain.
	OutcomeUncertain Outcome = "uncertain"
	// OutcomeRejected: the provider refused it → rejected (terminal).
	OutcomeRejected Outcome = "rejected"
	// OutcomeQuarantined: it cannot be sent as it stands → quarantined with
	// a reason.
	OutcomeQuarantined Outcome = "quarantined"
	// OutcomeStaleLease: the outcome write found another lease token; the
	// attempt row records it, the item is untouched (outbox.ErrStaleLease).
	OutcomeStaleLease Outcome = "stale_lease"
)

// Outcomes lists every outcome (metrics labels, docs).
var Outcomes = []Outcome{OutcomeAccepted, OutcomeRetry, OutcomeUncertain, OutcomeRejected, OutcomeQuarantined, OutcomeStaleLease}

// nextState maps an outcome to the state the item moves to.
func (o Outcome) nextState() outbox.State {
	switch o {
	case OutcomeAccepted:
		return outbox.StateAccepted
	case OutcomeRetry:
		return outbox.StatePending
	case OutcomeUncertain:
		return outbox.StateUncertain
	case OutcomeRejected:
		return outbox.StateRejected
	case OutcomeQuarantined:
		return outbox.StateQuarantined
	case OutcomeStaleLease:
		return outbox.StateLeased // never written: a stale write changes nothing
	default:
		panic(fmt.Sprintf("deliverer: unknown outcome %q", string(o)))
	}
}

// Request is one meter event to send. Every field is a pure function of the
// outbox row and its meter mapping, so every attempt sends the same bytes.
type Request struct {
	ItemID      int64     // outbox_items.id, for logs only
	Account     string    // outbox_items.destination_account (the stream keeps one session per account)
	Via         string    // stripe_accounts.exporter: ExporterV1 ("v1") or ExporterStream ("stream")
	Key         string    // idempotency key: Idempotency-Key and the event identifier
	EventName   string    // meter_mappings.event_name
	CustomerKey string    // payload key of the customer, meter_mappings.customer_key
	ValueKey    string    // payload key of the value, meter_mappings.value_key
	Customer    string    // tenant_billing.stripe_customer; never logged
	Value       int64     // outbox_items.quantity, or a correction's planned value (≥ 0 either way: correction.go)
	Timestamp   time.Time // outbox_items.occurred_at, sent as Unix seconds
}

// Result is a provider answer, classified by the exporter's table.
type Result struct {
	Outcome     Outcome       // never OutcomeStaleLease
	Reason      outbox.Reason // set when Outcome is OutcomeQuarantined
	Rule        string        // name of the classification row that matched, e.g. "http_5xx"
	HTTPStatus  int           // 0 when no HTTP answer arrived
	RequestID   string        // Stripe's Request-Id header, when any
	ErrorCode   string        // Stripe error code, or a transport kind ("timeout", "connection")
	Message     string        // provider message, for outbox_attempts (never logged)
	ProviderRef string        // set when accepted: Stripe request id, else the identifier
}

// The exporters a destination account can choose (stripe_accounts.exporter).
const (
	ExporterV1     = "v1"     // one v1 meter event call per item (stripeexport)
	ExporterStream = "stream" // v2 meter event stream, batches of up to 100 (streamexport)
)

// Exporter sends one item to a provider and classifies the answer. It must
// not retry by itself (the deliverer's policy owns retries) and must honour
// ctx's deadline.
type Exporter interface {
	// Name is the outbox exporter this client serves (outbox_items.exporter).
	Name() string
	// Mode is the mode of its credentials (test for sk_test_/rk_test_ keys).
	Mode() identity.Mode
	// Export sends r and returns the classified answer; it never panics on a
	// provider answer and never returns an unclassified result.
	Export(ctx context.Context, r Request) Result
}

// GroupExporter is an Exporter that can send a lane's group as a unit:
// ExportGroup's requests (one lane: one account, customer and meter) go
// out in one provider call, or, beyond the provider's batch limit, in
// consecutive calls, never in concurrent ones, so a lane keeps Stripe's one
// call at a time per customer and meter while the exporter packs many
// lanes into one call. It returns one Result per request, in order, and
// honours ctx's deadline like Export. The deliverer uses it for the items
// of stream accounts (Request.Via == ExporterStream).
type GroupExporter interface {
	Exporter
	ExportGroup(ctx context.Context, rs []Request) []Result
}

// CancelRequest is one meter event cancel (a v1 meter event adjustment of
// type cancel). Every field is a pure function of the correction item and
// the item it corrects, so every attempt sends the same bytes.
type CancelRequest struct {
	ItemID     int64  // the correction's outbox_items.id, for logs only
	Account    string // outbox_items.destination_account
	Key        string // Idempotency-Key: the correction's key + ":cancel" (usage.CorrectionPlan)
	EventName  string // meter_mappings.event_name of the cancelled event
	Identifier string // the cancelled event's identifier: the corrected item's key
}

// Canceller is an exporter that can cancel a meter event Stripe received
// less than 24 h ago. Both exporters' accounts cancel through Stripe's v1
// adjustments endpoint (the v2 stream has no adjustments). Cancel must not
// retry by itself and must honour ctx's deadline. A cancel Stripe already
// applied (a replay of the same Idempotency-Key, or an identifier already
// cancelled) is OutcomeAccepted.
type Canceller interface {
	Cancel(ctx context.Context, r CancelRequest) Result
}
