package inbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aurora-billing/aurora/shared/clock"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Resolving a same-second ambiguity from provider truth (docs/inbox.md,
// "Same-second events"). The events of an ambiguity cannot be ordered, so
// they do not decide; Stripe's current object does. An operator reads the
// ambiguity (ReadAmbiguity), fetches the current subscription or invoices
// from Stripe on the operator's side — never on the webhook path — and sees
// what they would project (PlanResolution), then applies it
// (ApplyResolution): the projections and the entitlement follow the
// provider's state, the ambiguity's events are settled as
// OutcomeResolved, and the decision is audited with operator, reason, the
// fetched objects and the projection (billing_ambiguity_resolutions) in the
// same transaction.

// Resolution errors.
var (
	// ErrNotAmbiguous: the event belongs to no same-second ambiguity.
	ErrNotAmbiguous = errors.New("inbox: event belongs to no same-second ambiguity")
	// ErrAmbiguityResolved: the ambiguity was resolved already.
	ErrAmbiguityResolved = errors.New("inbox: ambiguity already resolved")
	// ErrAmbiguityChanged: an event joined the ambiguity after the
	// provider was read; read it again.
	ErrAmbiguityChanged = errors.New("inbox: ambiguity changed since the provider was read")
	// ErrInvalidResolve: operator or reason missing.
	ErrInvalidResolve = errors.New("inbox: invalid resolution")
	// ErrProviderRefused: the provider's object cannot decide the
	// ambiguity (another customer or subscription, an unmapped price, an
	// invoice that is neither paid nor failed, another nonterminal
	// subscription of the tenant). Wrapped by *ProviderRefusal.
	ErrProviderRefused = errors.New("inbox: provider state cannot resolve the ambiguity")
	// ErrProvider: the provider could not be read. Wrapped by
	// *ProviderError.
	ErrProvider = errors.New("inbox: provider call failed")
)

// ProviderRefusal says why the provider's state cannot be applied. It
// wraps ErrProviderRefused; Why never carries a customer id.
type ProviderRefusal struct{ Why string }

func (e *ProviderRefusal) Error() string {
	return "inbox: provider state cannot resolve the ambiguity: " + e.Why
}

// Unwrap returns ErrProviderRefused.
func (e *ProviderRefusal) Unwrap() error { return ErrProviderRefused }

func refused(format string, args ...any) error {
	return &ProviderRefusal{Why: fmt.Sprintf(format, args...)}
}

// Provider reads Stripe's current objects: the raw JSON body of GET
// /v1/subscriptions/{id} or GET /v1/invoices/{id}. Errors wrap ErrProvider.
type Provider interface {
	Subscription(ctx context.Context, id string) (json.RawMessage, error)
	Invoice(ctx context.Context, id string) (json.RawMessage, error)
}

// OutcomeResolved: an event of a same-second ambiguity an operator
// resolved from the provider's state (its effect is the provider's).
const OutcomeResolved Outcome = "resolved"

// Ambiguity is one same-second ambiguity as an operator sees it: never a
// customer id or a payload.
type Ambiguity struct {
	ID     int64  `json:"id"`
	Kind   string `json:"kind"` // subscription | invoice
	Reason Reason `json:"reason"`
	// SubscriptionID: the subscription of a subscription ambiguity ("" for
	// invoices, whose subject is the customer).
	SubscriptionID string           `json:"subscription_id,omitempty"`
	Tenant         string           `json:"tenant"`
	EventSecond    time.Time        `json:"event_second"`
	Status         string           `json:"status"` // open | resolved
	OpenedAt       time.Time        `json:"opened_at"`
	ResolvedAt     *time.Time       `json:"resolved_at"`
	Events         []AmbiguousEvent `json:"events"`
	// Held: the projections as they stand (held at what the events before
	// the second established while open).
	Held       Projection  `json:"held"`
	Resolution *Resolution `json:"resolution,omitempty"`

	customer string
}

// AmbiguousEvent is one event of an ambiguity and what it says.
type AmbiguousEvent struct {
	EventID      string                 `json:"event_id"`
	Type         string                 `json:"type"`
	Created      time.Time              `json:"created"`
	State        EventState             `json:"state"`
	Subscription *ProjectedSubscription `json:"subscription,omitempty"`
	Invoice      *ProjectedInvoice      `json:"invoice,omitempty"`
}

// Projection is a subscription or a customer's invoices with the tenant's
// entitlement: held now, or what a resolution would write.
type Projection struct {
	Subscription *ProjectedSubscription `json:"subscription,omitempty"`
	Invoices     []ProjectedInvoice     `json:"invoices,omitempty"`
	// InvoiceStatus: the customer-level invoice status (paid, failed, nil).
	InvoiceStatus *string `json:"invoice_status,omitempty"`
	// InvoiceStatusKept: a resolution leaves the customer-level status to a
	// later invoice outcome that already set it.
	InvoiceStatusKept bool            `json:"invoice_status_kept,omitempty"`
	Entitlement       EntitlementView `json:"entitlement"`
}

// ProjectedSubscription is a subscription's projected state.
type ProjectedSubscription struct {
	ID                string     `json:"id"`
	Status            string     `json:"status"`
	PriceID           *string    `json:"price_id"`
	Plan              *string    `json:"plan"`
	CurrentPeriodEnd  *time.Time `json:"current_period_end"`
	CancelAtPeriodEnd bool       `json:"cancel_at_period_end"`
}

// ProjectedInvoice is an invoice's projected outcome (paid | failed);
// ProviderStatus is Stripe's invoice status when read from the provider.
type ProjectedInvoice struct {
	ID             string `json:"id"`
	SubscriptionID string `json:"subscription_id"`
	Outcome        string `json:"outcome"`
	ProviderStatus string `json:"provider_status,omitempty"`
}

// EntitlementView is a tenant's entitlement (nil fields: none).
type EntitlementView struct {
	SubscriptionID     *string    `json:"subscription_id"`
	SubscriptionStatus *string    `json:"subscription_status"`
	Plan               *string    `json:"plan"`
	BillingStatus      string     `json:"billing_status"`
	GraceUntil         *time.Time `json:"grace_until"`
}

// Resolution is the audit of an applied resolution.
type Resolution struct {
	Operator   string     `json:"operator"`
	Reason     string     `json:"reason"`
	Source     string     `json:"source"`
	FetchedAt  time.Time  `json:"fetched_at"`
	ResolvedAt time.Time  `json:"resolved_at"`
	Projection Projection `json:"projection"`
}

const sqlAmbiguityOf = `
SELECT a.id, a.kind, a.reason, a.subject_id, a.customer_id, a.tenant, a.event_second, a.status, a.opened_at, a.resolved_at
  FROM billing_ambiguity_events m JOIN billing_ambiguities a ON a.id = m.ambiguity_id
 WHERE m.event_id = $1`

const sqlAmbiguityEvents = `
SELECT b.event_id, b.event_type, b.payload, b.processed_at IS NOT NULL, b.dead_letter_at IS NOT NULL
  FROM billing_ambiguity_events m JOIN billing_events b ON b.event_id = m.event_id
 WHERE m.ambiguity_id = $1
 ORDER BY b.event_id`

// ReadAmbiguity returns the ambiguity holding eventID with its events and
// the projections as they stand. Errors: ErrEventNotFound,
// ErrNotAmbiguous.
func ReadAmbiguity(ctx context.Context, q Querier, eventID string) (Ambiguity, error) {
	a, err := readAmbiguity(ctx, q, eventID, false)
	if err != nil && !errors.Is(err, ErrEventNotFound) && !errors.Is(err, ErrNotAmbiguous) {
		return Ambiguity{}, fmt.Errorf("inbox: read ambiguity: %w", err)
	}
	return a, err
}

func readAmbiguity(ctx context.Context, q Querier, eventID string, forUpdate bool) (Ambiguity, error) {
	var a Ambiguity
	var subject, reason string
	sql := sqlAmbiguityOf
	if forUpdate {
		sql += " FOR UPDATE OF a"
	}
	err := q.QueryRow(ctx, sql, eventID).Scan(&a.ID, &a.Kind, &reason, &subject, &a.customer, &a.Tenant, &a.EventSecond,
		&a.Status, &a.OpenedAt, &a.ResolvedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		var exists bool
		if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM billing_events WHERE event_id = $1)`, eventID).Scan(&exists); err != nil {
			return Ambiguity{}, err
		}
		if !exists {
			return Ambiguity{}, fmt.Errorf("%w: %s", ErrEventNotFound, eventID)
		}
		return Ambiguity{}, fmt.Errorf("%w: %s", ErrNotAmbiguous, eventID)
	}
	if err != nil {
		return Ambiguity{}, err
	}
	a.Reason = Reason(reason)
	if a.Kind == ambiguitySubscription {
		a.SubscriptionID = subject
	}
	rows, err := q.Query(ctx, sqlAmbiguityEvents, a.ID)
	if err != nil {
		return Ambiguity{}, err
	}
	a.Events, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (AmbiguousEvent, error) {
		var (
			ev                AmbiguousEvent
			payload           []byte
			processed, letter bool
		)
		if err := r.Scan(&ev.EventID, &ev.Type, &payload, &processed, &letter); err != nil {
			return ev, err
		}
		ev.State = StatePending
		switch {
		case processed:
			ev.State = StateProcessed
		case letter:
			ev.State = StateDeadLetter
		}
		if p, err := parseEvent(payload); err == nil {
			ev.Created = p.Created
			switch {
			case p.Subscription != nil:
				ev.Subscription = projectedOf(p.Subscription, nil)
			case p.Invoice != nil:
				ev.Invoice = &ProjectedInvoice{ID: p.Invoice.ID, SubscriptionID: p.Invoice.SubscriptionID, Outcome: p.Invoice.Outcome}
			}
		}
		return ev, nil
	})
	if err != nil {
		return Ambiguity{}, err
	}
	if a.Held, err = heldProjection(ctx, q, a); err != nil {
		return Ambiguity{}, err
	}
	if a.Status == ambiguityResolved {
		var r Resolution
		var proj []byte
		err := q.QueryRow(ctx, `SELECT operator, reason, source, fetched_at, resolved_at, projection
  FROM billing_ambiguity_resolutions WHERE ambiguity_id = $1`, a.ID).Scan(&r.Operator, &r.Reason, &r.Source, &r.FetchedAt, &r.ResolvedAt, &proj)
		if err != nil {
			return Ambiguity{}, err
		}
		if err := json.Unmarshal(proj, &r.Projection); err != nil {
			return Ambiguity{}, fmt.Errorf("stored projection: %w", err)
		}
		a.Resolution = &r
	}
	return a, nil
}

func projectedOf(s *subscriptionObject, plan *string) *ProjectedSubscription {
	p := &ProjectedSubscription{ID: s.ID, Status: s.Status, CurrentPeriodEnd: s.CurrentPeriodEnd, CancelAtPeriodEnd: s.CancelAtPeriodEnd, Plan: plan}
	if len(s.PriceIDs) > 0 {
		p.PriceID = &s.PriceIDs[0]
	}
	return p
}

// invoiceIDs returns the distinct invoices the ambiguity's events name.
func (a Ambiguity) invoiceIDs() []string {
	var ids []string
	for _, ev := range a.Events {
		if ev.Invoice != nil && !slices.Contains(ids, ev.Invoice.ID) {
			ids = append(ids, ev.Invoice.ID)
		}
	}
	slices.Sort(ids)
	return ids
}

// eventIDs returns the ambiguity's event ids.
func (a Ambiguity) eventIDs() []string {
	ids := make([]string, len(a.Events))
	for i, ev := range a.Events {
		ids[i] = ev.EventID
	}
	return ids
}

// heldProjection reads the projections of a's subject as they stand.
func heldProjection(ctx context.Context, q Querier, a Ambiguity) (Projection, error) {
	var p Projection
	var billing *string
	err := q.QueryRow(ctx, `
SELECT e.subscription_id, e.subscription_status, e.plan, e.billing_status, e.grace_until,
       (SELECT invoice_status FROM stripe_customer_links WHERE customer_id = $2)
  FROM (SELECT 1) one LEFT JOIN tenant_entitlements e ON e.tenant = $1`, a.Tenant, a.customer).
		Scan(&p.Entitlement.SubscriptionID, &p.Entitlement.SubscriptionStatus, &p.Entitlement.Plan, &billing, &p.Entitlement.GraceUntil, &p.InvoiceStatus)
	if err != nil {
		return p, err
	}
	p.Entitlement.BillingStatus = billingNone
	if billing != nil {
		p.Entitlement.BillingStatus = *billing
	}
	switch a.Kind {
	case ambiguitySubscription:
		s := ProjectedSubscription{ID: a.SubscriptionID}
		err := q.QueryRow(ctx, `SELECT status, price_id, plan, current_period_end, cancel_at_period_end
  FROM stripe_subscriptions WHERE subscription_id = $1`, a.SubscriptionID).Scan(&s.Status, &s.PriceID, &s.Plan, &s.CurrentPeriodEnd, &s.CancelAtPeriodEnd)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return p, err
		default:
			p.Subscription = &s
		}
	default:
		rows, err := q.Query(ctx, `SELECT invoice_id, subscription_id, outcome FROM stripe_invoices WHERE invoice_id = ANY($1) ORDER BY invoice_id`, a.invoiceIDs())
		if err != nil {
			return p, err
		}
		p.Invoices, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (ProjectedInvoice, error) {
			var i ProjectedInvoice
			err := r.Scan(&i.ID, &i.SubscriptionID, &i.Outcome)
			return i, err
		})
		if err != nil {
			return p, err
		}
	}
	return p, nil
}

// ProviderState is what the provider answered for one ambiguity: the raw
// objects, kept as the resolution's evidence.
type ProviderState struct {
	AmbiguityID   int64                      `json:"ambiguity_id"`
	EventIDs      []string                   `json:"event_ids"`
	FetchedAt     time.Time                  `json:"fetched_at"`
	Subscriptions map[string]json.RawMessage `json:"subscriptions,omitempty"`
	Invoices      map[string]json.RawMessage `json:"invoices,omitempty"`
}

// ResolutionPlan is an open ambiguity, what the provider answered and
// what applying it would project.
type ResolutionPlan struct {
	Ambiguity Ambiguity     `json:"ambiguity"`
	FetchedAt time.Time     `json:"fetched_at"`
	Would     Projection    `json:"would_project"`
	state     ProviderState // evidence
	writes    resolutionWrites
}

// resolutionWrites is what applying a plan writes (customer ids included:
// never shown).
type resolutionWrites struct {
	sub      *subscriptionObject
	plan     *string
	invoices []resolvedInvoice
	status   *string // new customer-level status, nil: kept
}

type resolvedInvoice struct {
	id, subscription, outcome string
}

// fetch reads a's objects from the provider.
func fetch(ctx context.Context, a Ambiguity, p Provider, now time.Time) (ProviderState, error) {
	st := ProviderState{AmbiguityID: a.ID, EventIDs: a.eventIDs(), FetchedAt: now}
	switch a.Kind {
	case ambiguitySubscription:
		raw, err := p.Subscription(ctx, a.SubscriptionID)
		if err != nil {
			return st, err
		}
		st.Subscriptions = map[string]json.RawMessage{a.SubscriptionID: raw}
	default:
		st.Invoices = map[string]json.RawMessage{}
		for _, id := range a.invoiceIDs() {
			raw, err := p.Invoice(ctx, id)
			if err != nil {
				return st, err
			}
			st.Invoices[id] = raw
		}
	}
	return st, nil
}

// PlanResolution reads the open ambiguity holding eventID, fetches its
// subscription or invoices from p and returns what applying them would
// project. It writes nothing. c nil means the wall clock for the fetch
// time. Errors: ErrEventNotFound, ErrNotAmbiguous, ErrAmbiguityResolved,
// *ProviderError (ErrProvider), *ProviderRefusal (ErrProviderRefused).
func PlanResolution(ctx context.Context, q Querier, p Provider, c clock.Clock, eventID string) (ResolutionPlan, error) {
	a, err := ReadAmbiguity(ctx, q, eventID)
	if err != nil {
		return ResolutionPlan{}, err
	}
	if a.Status != ambiguityOpen {
		return ResolutionPlan{Ambiguity: a}, fmt.Errorf("%w: ambiguity %d", ErrAmbiguityResolved, a.ID)
	}
	st, err := fetch(ctx, a, p, fetchTime(c))
	if err != nil {
		return ResolutionPlan{Ambiguity: a}, err
	}
	plan, err := planFrom(ctx, q, a, st)
	if err != nil && !errors.Is(err, ErrProviderRefused) {
		err = fmt.Errorf("inbox: plan resolution: %w", err)
	}
	return plan, err
}

func fetchTime(c clock.Clock) time.Time {
	if t := clock.Or(c).Override(); t != nil {
		return *t
	}
	return time.Now().UTC().Truncate(time.Microsecond)
}

// planFrom decides what st projects for a, reading the price mapping and
// the tenant's other subscriptions from q.
func planFrom(ctx context.Context, q Querier, a Ambiguity, st ProviderState) (ResolutionPlan, error) {
	plan := ResolutionPlan{Ambiguity: a, FetchedAt: st.FetchedAt, state: st}
	would := a.Held
	would.Invoices = nil
	switch a.Kind {
	case ambiguitySubscription:
		ev := &event{}
		if err := parseSubscription(ev, st.Subscriptions[a.SubscriptionID]); err != nil {
			return plan, refused("the provider's subscription is unreadable (%v)", err)
		}
		sub := ev.Subscription
		switch {
		case sub.ID != a.SubscriptionID:
			return plan, refused("the provider answered subscription %s for %s", sub.ID, a.SubscriptionID)
		case ev.Customer != a.customer:
			return plan, refused("the provider's subscription %s belongs to another customer", sub.ID)
		}
		var granted, mapped *string
		if !terminalSubscriptionStatus(sub.Status) {
			if len(sub.PriceIDs) == 0 {
				return plan, refused("the provider's subscription %s names no price", sub.ID)
			}
			var competing bool
			var prices, plans []string
			if err := q.QueryRow(ctx, `
SELECT ARRAY(SELECT price_id FROM stripe_price_plans WHERE price_id = ANY($1) ORDER BY price_id),
       ARRAY(SELECT plan FROM stripe_price_plans WHERE price_id = ANY($1) ORDER BY price_id),
       EXISTS (SELECT 1 FROM stripe_subscriptions WHERE tenant = $2 AND subscription_id <> $3
                  AND status NOT IN ('canceled', 'incomplete_expired'))`, sub.PriceIDs, a.Tenant, sub.ID).Scan(&prices, &plans, &competing); err != nil {
				return plan, err
			}
			if competing {
				return plan, refused("the tenant has another nonterminal subscription (%s)", ReasonAmbiguousMultiSubscription)
			}
			for _, pr := range sub.PriceIDs {
				if !slices.Contains(prices, pr) {
					return plan, refused("price %s is not mapped to a plan (auroractl inbox plans set)", pr)
				}
			}
			pl := plans[slices.Index(prices, sub.PriceIDs[0])]
			mapped = &pl
			if entitledSubscriptionStatus(sub.Status) {
				granted = mapped
			}
		}
		would.Subscription = projectedOf(sub, mapped)
		status := sub.Status
		would.Entitlement.SubscriptionID, would.Entitlement.SubscriptionStatus, would.Entitlement.Plan = &sub.ID, &status, granted
		plan.writes = resolutionWrites{sub: sub, plan: mapped}
	default:
		anyFailed := false
		for _, id := range a.invoiceIDs() {
			inv, status, err := providerInvoice(st.Invoices[id])
			if err != nil {
				return plan, refused("the provider's invoice %s is unreadable (%v)", id, err)
			}
			switch {
			case inv.ID != id:
				return plan, refused("the provider answered invoice %s for %s", inv.ID, id)
			case inv.customer != a.customer:
				return plan, refused("the provider's invoice %s belongs to another customer", id)
			}
			for _, ev := range a.Events {
				if ev.Invoice != nil && ev.Invoice.ID == id && ev.Invoice.SubscriptionID != inv.SubscriptionID {
					return plan, refused("the provider's invoice %s names another subscription than its events", id)
				}
			}
			outcome, ok := invoiceOutcome(status)
			if !ok {
				return plan, refused("the provider's invoice %s is %s, neither paid nor a failed payment; wait for Stripe to settle it", id, status.describe())
			}
			anyFailed = anyFailed || outcome == invoiceFailed
			would.Invoices = append(would.Invoices, ProjectedInvoice{ID: id, SubscriptionID: inv.SubscriptionID, Outcome: outcome, ProviderStatus: status.Status})
			plan.writes.invoices = append(plan.writes.invoices, resolvedInvoice{id: id, subscription: inv.SubscriptionID, outcome: outcome})
		}
		var custCreated *time.Time
		if err := q.QueryRow(ctx, `SELECT invoice_status_event_created FROM stripe_customer_links WHERE customer_id = $1`, a.customer).Scan(&custCreated); err != nil {
			return plan, err
		}
		if custCreated != nil && custCreated.After(a.EventSecond) {
			would.InvoiceStatusKept = true // a later invoice outcome set the status: it stands
			break
		}
		outcome := invoicePaid
		would.Entitlement.BillingStatus, would.Entitlement.GraceUntil = billingCurrent, nil
		if anyFailed {
			// one of the second's invoices is unpaid at Stripe: grace from
			// that second, as the failure event would have set it
			outcome = invoiceFailed
			g := a.EventSecond.Add(GracePeriod)
			would.Entitlement.BillingStatus, would.Entitlement.GraceUntil = billingGrace, &g
		}
		would.InvoiceStatus = &outcome
		plan.writes.status = &outcome
	}
	plan.Would = would
	return plan, nil
}

// providerInvoiceStatus is the part of a provider invoice that says how its
// payment stands.
type providerInvoiceStatus struct {
	Status    string `json:"status"`
	Attempted bool   `json:"attempted"`
}

func (s providerInvoiceStatus) describe() string {
	if s.Attempted {
		return strconv.Quote(s.Status) + " after a payment attempt"
	}
	return strconv.Quote(s.Status) + " without a payment attempt"
}

type providerInvoiceObject struct {
	invoiceObject
	customer string
}

func providerInvoice(raw json.RawMessage) (providerInvoiceObject, providerInvoiceStatus, error) {
	ev := &event{}
	if err := parseInvoice(ev, raw); err != nil {
		return providerInvoiceObject{}, providerInvoiceStatus{}, err
	}
	var st providerInvoiceStatus
	if err := json.Unmarshal(raw, &st); err != nil {
		return providerInvoiceObject{}, providerInvoiceStatus{}, &PayloadError{Field: "status", Reason: "is not a string"}
	}
	return providerInvoiceObject{invoiceObject: *ev.Invoice, customer: ev.Customer}, st, nil
}

// invoiceOutcome maps Stripe's invoice state to the outcome the invoice
// events project: paid is paid; open or uncollectible after a payment
// attempt is a failed payment; anything else (draft, void, open without an
// attempt) decides nothing.
func invoiceOutcome(s providerInvoiceStatus) (string, bool) {
	switch {
	case s.Status == "paid":
		return invoicePaid, true
	case (s.Status == "open" || s.Status == "uncollectible") && s.Attempted:
		return invoiceFailed, true
	default:
		return "", false
	}
}

// ResolveInput names the ambiguity (by one of its events) and who decided.
type ResolveInput struct {
	EventID  string
	Operator string
	Reason   string
}

// Validate returns ErrInvalidResolve naming the missing field.
func (in ResolveInput) Validate() error {
	switch {
	case strings.TrimSpace(in.EventID) == "":
		return fmt.Errorf("%w: event id is required", ErrInvalidResolve)
	case strings.TrimSpace(in.Operator) == "":
		return fmt.Errorf("%w: operator is required", ErrInvalidResolve)
	case strings.TrimSpace(in.Reason) == "":
		return fmt.Errorf("%w: reason is required", ErrInvalidResolve)
	}
	return nil
}

// ApplyResolution fetches the provider's objects for the open ambiguity
// holding in.EventID (before any transaction: no lock is held across a
// network call), then in one transaction, under the customer's advisory
// lock (the worker's, so no projection of this customer runs meanwhile)
// and with the ambiguity row locked: re-plans from the fetched objects,
// writes the projections and the entitlement, settles the ambiguity's
// events as OutcomeResolved, marks the ambiguity resolved and records the
// resolution (operator, reason, objects, projection). Errors: as
// PlanResolution, ErrInvalidResolve, ErrAmbiguityChanged. c nil means the
// database clock.
func ApplyResolution(ctx context.Context, pool *pgxpool.Pool, p Provider, c clock.Clock, in ResolveInput) (ResolutionPlan, error) {
	if err := in.Validate(); err != nil {
		return ResolutionPlan{}, err
	}
	pre, err := ReadAmbiguity(ctx, pool, in.EventID)
	if err != nil {
		return ResolutionPlan{}, err
	}
	if pre.Status != ambiguityOpen {
		return ResolutionPlan{Ambiguity: pre}, fmt.Errorf("%w: ambiguity %d", ErrAmbiguityResolved, pre.ID)
	}
	st, err := fetch(ctx, pre, p, fetchTime(c))
	if err != nil {
		return ResolutionPlan{Ambiguity: pre}, err
	}
	now := clock.Or(c).Override()
	var plan ResolutionPlan
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('aurora.inbox.stripe_customer:' || $1, 0))`, pre.customer); err != nil {
			return err
		}
		a, err := readAmbiguity(ctx, tx, in.EventID, true)
		if err != nil {
			return err
		}
		if a.Status != ambiguityOpen {
			return fmt.Errorf("%w: ambiguity %d", ErrAmbiguityResolved, a.ID)
		}
		if a.ID != st.AmbiguityID || !slices.Equal(a.eventIDs(), st.EventIDs) {
			return fmt.Errorf("%w: ambiguity %d now holds %s", ErrAmbiguityChanged, a.ID, strings.Join(a.eventIDs(), ", "))
		}
		if plan, err = planFrom(ctx, tx, a, st); err != nil {
			return err
		}
		var at time.Time
		if err := tx.QueryRow(ctx, `SELECT coalesce($1::timestamptz, now())`, now).Scan(&at); err != nil {
			return err
		}
		return writeResolution(ctx, tx, plan, in, at)
	})
	if err != nil {
		var pe *ProviderError
		if errors.Is(err, ErrProviderRefused) || errors.Is(err, ErrAmbiguityResolved) || errors.Is(err, ErrAmbiguityChanged) ||
			errors.Is(err, ErrEventNotFound) || errors.Is(err, ErrNotAmbiguous) || errors.As(err, &pe) {
			return plan, err
		}
		return plan, fmt.Errorf("inbox: apply resolution: %w", err)
	}
	plan.Ambiguity, err = ReadAmbiguity(ctx, pool, in.EventID)
	return plan, err
}

// resolutionEventID is the last_event_id a resolution writes on the rows it
// projects: not a Stripe event, the ambiguity it resolved.
func resolutionEventID(id int64) string { return "ambiguity_resolution:" + strconv.FormatInt(id, 10) }

// writeResolution writes plan's projections inside tx at time at. Each
// row's guard moves to the ambiguity's second unless a later event already
// moved it further; a row moving to the second keeps what it was as its
// prior snapshot, as the worker does.
func writeResolution(ctx context.Context, tx pgx.Tx, plan ResolutionPlan, in ResolveInput, at time.Time) error {
	a, w := plan.Ambiguity, plan.writes
	marker := resolutionEventID(a.ID)
	b := &pgx.Batch{}
	if w.sub != nil {
		var price *string
		if len(w.sub.PriceIDs) > 0 {
			price = &w.sub.PriceIDs[0]
		}
		var granted *string
		if entitledSubscriptionStatus(w.sub.Status) {
			granted = w.plan
		}
		b.Queue(`
WITH cur AS (
  SELECT s.*, e.subscription_id AS e_sub, e.subscription_status AS e_status, e.plan AS e_plan
    FROM (SELECT 1) one
    LEFT JOIN stripe_subscriptions s ON s.subscription_id = $1
    LEFT JOIN tenant_entitlements e ON e.tenant = $3)
INSERT INTO stripe_subscriptions (subscription_id, customer_id, tenant, status, price_id, plan, current_period_end,
                                  cancel_at_period_end, last_event_id, last_event_created, updated_at, prior)
SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, greatest(cur.last_event_created, $10), $11,
       CASE WHEN cur.last_event_created > $10 THEN cur.prior ELSE jsonb_build_object(
         'row', CASE WHEN cur.subscription_id IS NULL THEN NULL ELSE jsonb_build_object(
                  'status', cur.status, 'price_id', cur.price_id, 'plan', cur.plan, 'current_period_end', cur.current_period_end,
                  'cancel_at_period_end', cur.cancel_at_period_end, 'last_event_id', cur.last_event_id,
                  'last_event_created', cur.last_event_created) END,
         'entitlement', jsonb_build_object('subscription_id', cur.e_sub, 'subscription_status', cur.e_status, 'plan', cur.e_plan)) END
  FROM cur
ON CONFLICT (subscription_id) DO UPDATE SET
    status = EXCLUDED.status, price_id = EXCLUDED.price_id, plan = EXCLUDED.plan,
    current_period_end = EXCLUDED.current_period_end, cancel_at_period_end = EXCLUDED.cancel_at_period_end,
    last_event_id = EXCLUDED.last_event_id, last_event_created = EXCLUDED.last_event_created,
    updated_at = EXCLUDED.updated_at, prior = EXCLUDED.prior`,
			w.sub.ID, a.customer, a.Tenant, w.sub.Status, price, w.plan, w.sub.CurrentPeriodEnd, w.sub.CancelAtPeriodEnd,
			marker, a.EventSecond, at)
		b.Queue(`
INSERT INTO tenant_entitlements (tenant, customer_id, subscription_id, subscription_status, plan, updated_at)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (tenant) DO UPDATE SET
    subscription_id = EXCLUDED.subscription_id, subscription_status = EXCLUDED.subscription_status,
    plan = EXCLUDED.plan, updated_at = EXCLUDED.updated_at`, a.Tenant, a.customer, w.sub.ID, w.sub.Status, granted, at)
	}
	for _, inv := range w.invoices {
		b.Queue(`
WITH cur AS (SELECT i.* FROM (SELECT 1) one LEFT JOIN stripe_invoices i ON i.invoice_id = $1)
INSERT INTO stripe_invoices (invoice_id, customer_id, tenant, subscription_id, outcome, last_event_id, last_event_created, updated_at, prior)
SELECT $1, $2, $3, $4, $5, $6, greatest(cur.last_event_created, $7), $8,
       CASE WHEN cur.last_event_created > $7 THEN cur.prior ELSE jsonb_build_object(
         'row', CASE WHEN cur.invoice_id IS NULL THEN NULL ELSE jsonb_build_object(
                  'outcome', cur.outcome, 'last_event_id', cur.last_event_id, 'last_event_created', cur.last_event_created) END) END
  FROM cur
ON CONFLICT (invoice_id) DO UPDATE SET
    outcome = EXCLUDED.outcome, last_event_id = EXCLUDED.last_event_id,
    last_event_created = EXCLUDED.last_event_created, updated_at = EXCLUDED.updated_at, prior = EXCLUDED.prior`,
			inv.id, a.customer, a.Tenant, inv.subscription, inv.outcome, marker, a.EventSecond, at)
	}
	if w.status != nil {
		billing, grace := plan.Would.Entitlement.BillingStatus, plan.Would.Entitlement.GraceUntil
		b.Queue(`
UPDATE stripe_customer_links l
   SET invoice_status_prior = CASE WHEN l.invoice_status_event_created IS DISTINCT FROM $2 THEN jsonb_build_object(
         'status', CASE WHEN l.invoice_status_event_created IS NULL THEN NULL ELSE jsonb_build_object(
                     'invoice_status', l.invoice_status, 'invoice_status_event_id', l.invoice_status_event_id,
                     'invoice_status_event_created', l.invoice_status_event_created) END,
         'entitlement', (SELECT jsonb_build_object('billing_status', coalesce(e.billing_status, 'none'), 'grace_until', e.grace_until)
                           FROM (SELECT 1) one LEFT JOIN tenant_entitlements e ON e.tenant = l.tenant))
       ELSE l.invoice_status_prior END,
       invoice_status_event_created = $2, invoice_status_event_id = $3, invoice_status = $4
 WHERE l.customer_id = $1`, a.customer, a.EventSecond, marker, *w.status)
		b.Queue(`
INSERT INTO tenant_entitlements (tenant, customer_id, billing_status, grace_until, updated_at)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (tenant) DO UPDATE SET
    billing_status = EXCLUDED.billing_status, grace_until = EXCLUDED.grace_until, updated_at = EXCLUDED.updated_at`,
			a.Tenant, a.customer, billing, grace, at)
	}
	if err := announceResolution(b, plan, marker); err != nil {
		return err
	}
	b.Queue(`
UPDATE billing_events SET processed_at = $2, outcome = $3, dead_letter_at = NULL, last_error = NULL
 WHERE event_id = ANY($1) AND processed_at IS NULL`, a.eventIDs(), at, string(OutcomeResolved))
	b.Queue(`UPDATE billing_ambiguities SET status = $2, resolved_at = $3 WHERE id = $1 AND status = 'open'`, a.ID, ambiguityResolved, at)
	b.Queue(`
INSERT INTO billing_ambiguity_resolutions (ambiguity_id, operator, reason, source, provider_objects, projection, fetched_at, resolved_at)
VALUES ($1, $2, $3, 'provider', $4::jsonb, $5::jsonb, $6, $7)`,
		a.ID, in.Operator, in.Reason, mustJSON(plan.state), mustJSON(plan.Would), plan.FetchedAt, at)
	return tx.SendBatch(ctx, b).Close()
}

// announceResolution queues the domain events of a resolution in its
// batch (announce.go), as the worker would for the same change: the
// subscription or invoice outcomes Stripe's state sets and, when it moves,
// EntitlementChanged.v1. Their stripe_event_id is marker
// (ambiguity_resolution:<id>: the state came from no single Stripe event)
// and stripe_event_created the ambiguity's second.
func announceResolution(b *pgx.Batch, plan ResolutionPlan, marker string) error {
	a, w, held, would := plan.Ambiguity, plan.writes, plan.Ambiguity.Held, plan.Would
	p := &projector{writes: b}
	if w.sub != nil {
		changed := SubscriptionChanged{Tenant: a.Tenant, SubscriptionID: w.sub.ID, Status: w.sub.Status, Plan: w.plan,
			CurrentPeriodEnd: w.sub.CurrentPeriodEnd, CancelAtPeriodEnd: w.sub.CancelAtPeriodEnd, StripeEventID: marker, StripeEventCreated: a.EventSecond}
		if held.Subscription != nil {
			st := held.Subscription.Status
			changed.PreviousStatus, changed.PreviousPlan = &st, held.Subscription.Plan
		}
		if err := p.announce(EventSubscriptionChanged, w.sub.ID, changed, marker); err != nil {
			return err
		}
		he, we := held.Entitlement, would.Entitlement
		if !strPtrEqual(he.SubscriptionID, we.SubscriptionID) || !strPtrEqual(he.SubscriptionStatus, we.SubscriptionStatus) || !strPtrEqual(he.Plan, we.Plan) {
			if err := p.announce(EventEntitlementChanged, a.Tenant, EntitlementChanged{Tenant: a.Tenant, Cause: "subscription",
				SubscriptionID: w.sub.ID, SubscriptionStatus: w.sub.Status, Plan: we.Plan, PreviousPlan: he.Plan,
				StripeEventID: marker, StripeEventCreated: a.EventSecond}, marker); err != nil {
				return err
			}
		}
		return nil
	}
	for _, inv := range w.invoices {
		announced := InvoiceOutcome{Tenant: a.Tenant, InvoiceID: inv.id, SubscriptionID: inv.subscription,
			StripeEventID: marker, StripeEventCreated: a.EventSecond}
		var err error
		if inv.outcome == invoicePaid {
			err = p.announce(EventInvoicePaid, inv.id, announced, inv.id) // once per invoice, as the worker does
		} else {
			if w.status != nil {
				announced.GraceUntil = would.Entitlement.GraceUntil
			}
			err = p.announce(EventInvoicePaymentFailed, inv.id, announced, marker, inv.id)
		}
		if err != nil {
			return err
		}
	}
	he, we := held.Entitlement, would.Entitlement
	if w.status != nil && (he.BillingStatus != we.BillingStatus || !sameTime(he.GraceUntil, we.GraceUntil)) {
		return p.announce(EventEntitlementChanged, a.Tenant, EntitlementChanged{Tenant: a.Tenant, Cause: "invoice",
			BillingStatus: we.BillingStatus, PreviousBillingStatus: he.BillingStatus, GraceUntil: we.GraceUntil,
			StripeEventID: marker, StripeEventCreated: a.EventSecond}, marker)
	}
	return nil
}
