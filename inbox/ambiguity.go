package inbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// The order-independence rule (docs/inbox.md, "Same-second events").
//
// Stripe timestamps have one-second precision and Stripe delivers events in
// no guaranteed order. Two events of one subject in the same second that
// disagree cannot be ordered from the events, so neither may decide the
// entitlement:
//
//   - kind subscription: two different snapshots of one subscription in
//     one second (ReasonAmbiguousSubscriptionOrder);
//   - kind invoice: opposite outcomes of one invoice in one second, or an
//     outcome opposite to the customer's status set in the same second by
//     another invoice (ReasonAmbiguousInvoiceOrder). Both guards key the
//     ambiguity by (customer, second): every invoice outcome of the
//     customer in that second belongs to it.
//
// When the second event arrives, the worker records one ambiguity
// (billing_ambiguities) holding every event of that subject and second,
// both dead letters with the reason; restores the projections to what the
// events before that second established (the prior snapshot each
// projection row keeps of itself); and from then on every further event of
// that subject and second joins the ambiguity. The first event's effect is
// undone, so the end state is the same whichever arrived first. Later
// events (a later second) apply as usual on top of the restored state;
// earlier ones are judged against it. An operator resolves the ambiguity
// from Stripe's current object (resolve.go).

// Ambiguity kinds (billing_ambiguities.kind).
const (
	ambiguitySubscription = "subscription"
	ambiguityInvoice      = "invoice"
)

// Ambiguity statuses (billing_ambiguities.status).
const (
	// ambiguityOpen: the projections are held; set by the worker when a
	// same-second conflict is found. Out: a resolution.
	ambiguityOpen = "open"
	// ambiguityResolved: an operator applied the provider's state. Terminal.
	ambiguityResolved = "resolved"
)

// ambiguityKey names one ambiguity: its kind, subject (the subscription id,
// or the customer id for invoices) and Stripe second.
type ambiguityKey struct {
	kind     string
	subject  string
	customer string
	tenant   string
	second   time.Time
}

func (k ambiguityKey) reason() Reason {
	if k.kind == ambiguitySubscription {
		return ReasonAmbiguousSubscriptionOrder
	}
	return ReasonAmbiguousInvoiceOrder
}

// Prior snapshots, stored as jsonb on the projection rows (migration 00210_inbox_ambiguities).
type (
	subscriptionPrior struct {
		Row         *subscriptionRow        `json:"row"`
		Entitlement entitlementSubscription `json:"entitlement"`
	}
	subscriptionRow struct {
		Status            string     `json:"status"`
		PriceID           *string    `json:"price_id"`
		Plan              *string    `json:"plan"`
		CurrentPeriodEnd  *time.Time `json:"current_period_end"`
		CancelAtPeriodEnd bool       `json:"cancel_at_period_end"`
		LastEventID       string     `json:"last_event_id"`
		LastEventCreated  time.Time  `json:"last_event_created"`
	}
	entitlementSubscription struct {
		SubscriptionID     *string `json:"subscription_id"`
		SubscriptionStatus *string `json:"subscription_status"`
		Plan               *string `json:"plan"`
	}
	invoicePrior struct {
		Row *invoiceRow `json:"row"`
	}
	invoiceRow struct {
		Outcome          string    `json:"outcome"`
		LastEventID      string    `json:"last_event_id"`
		LastEventCreated time.Time `json:"last_event_created"`
	}
	statusPrior struct {
		Status      *invoiceStatus     `json:"status"`
		Entitlement entitlementBilling `json:"entitlement"`
	}
	invoiceStatus struct {
		InvoiceStatus string    `json:"invoice_status"`
		EventID       string    `json:"invoice_status_event_id"`
		EventCreated  time.Time `json:"invoice_status_event_created"`
	}
	entitlementBilling struct {
		BillingStatus string     `json:"billing_status"`
		GraceUntil    *time.Time `json:"grace_until"`
	}
)

// mustJSON encodes one of the prior snapshot types (plain values only, so
// encoding cannot fail).
func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("inbox: encode %T: %v", v, err))
	}
	return string(b)
}

// joinAmbiguity adds ev to the open ambiguity of key: a dead letter with
// the ambiguity's reason, nothing projected.
func (p *projector) joinAmbiguity(key ambiguityKey, ev *event) decision {
	p.queueMembers(key, []string{ev.ID})
	return decision{reason: key.reason(), keep: true}
}

const sqlAmbiguityCandidates = `
SELECT event_id, payload, outcome FROM billing_events
 WHERE customer_id = $1 AND event_created = $2 AND processed_at IS NOT NULL AND event_id <> $3
   AND outcome IN ('applied', 'unchanged', 'stale')
 ORDER BY event_id`

const sqlInvoicesAtSecond = `SELECT ARRAY(SELECT invoice_id FROM stripe_invoices WHERE customer_id = $1 AND last_event_created = $2)`

// openAmbiguity records the ambiguity of key with ev and every processed
// event whose effect at that second it undoes, and queues the restoring of
// the projections to their prior snapshots.
func (p *projector) openAmbiguity(ctx context.Context, key ambiguityKey, ev *event) (decision, error) {
	members, err := p.ambiguityMembers(ctx, key, ev.ID)
	if err != nil {
		return decision{}, err
	}
	// read before the restore is queued: the entitlement now and what the
	// restore puts back
	if err := p.announceRestoredEntitlement(ctx, key, ev); err != nil {
		return decision{}, err
	}
	p.writes.Queue(`
INSERT INTO billing_ambiguities (kind, reason, subject_id, customer_id, tenant, event_second, opened_at)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (kind, subject_id, event_second) DO NOTHING`,
		key.kind, string(key.reason()), key.subject, key.customer, key.tenant, key.second, p.now)
	switch key.kind {
	case ambiguitySubscription:
		p.queueSubscriptionRestore(key)
	default:
		p.queueInvoiceRestore(key)
	}
	p.queueMembers(key, append(members, ev.ID))
	if len(members) > 0 {
		// what was processed at that second becomes part of the ambiguity:
		// the same dead letter as if it had arrived second
		p.writes.Queue(`
UPDATE billing_events
   SET processed_at = NULL, outcome = NULL, dead_letter_at = $2, last_reason = $3, attempts = attempts + 1
 WHERE event_id = ANY($1) AND processed_at IS NOT NULL`, members, p.now, string(key.reason()))
	}
	return decision{reason: key.reason(), keep: true}, nil
}

// sqlRestoredSubscriptionEntitlement reads the tenant's subscription
// entitlement and the prior snapshot queueSubscriptionRestore puts back
// (the same rows: no row, no restore).
const sqlRestoredSubscriptionEntitlement = `
SELECT e.subscription_id, e.subscription_status, e.plan,
       s.prior->'entitlement'->>'subscription_id', s.prior->'entitlement'->>'subscription_status', s.prior->'entitlement'->>'plan'
  FROM stripe_subscriptions s
  JOIN tenant_entitlements e ON e.tenant = s.tenant AND e.subscription_id = s.subscription_id
 WHERE s.subscription_id = $1 AND s.last_event_created = $2 AND s.prior IS NOT NULL`

// sqlRestoredBillingEntitlement: the same for queueInvoiceRestore's
// billing status and grace.
const sqlRestoredBillingEntitlement = `
SELECT e.billing_status, e.grace_until,
       l.invoice_status_prior->'entitlement'->>'billing_status', (l.invoice_status_prior->'entitlement'->>'grace_until')::timestamptz
  FROM stripe_customer_links l
  JOIN tenant_entitlements e ON e.tenant = l.tenant
 WHERE l.customer_id = $1 AND l.invoice_status_event_created = $2 AND l.invoice_status_prior IS NOT NULL`

// announceRestoredEntitlement queues EntitlementChanged.v1 when opening the
// ambiguity of key moves the tenant's entitlement: the restore puts back
// what the events before key's second established, so a consumer that
// learnt of the first event's entitlement learns it no longer holds. The
// payload is the restored state, Previous* the one undone; stripe_event_id
// is ambiguity_opened:<the event that opened it> (the state came from the
// prior snapshot, not from that event) and stripe_event_created the
// ambiguity's second. Nothing is announced when the restore changes no
// entitlement column (the first event had not moved it, or there is no
// prior snapshot to restore).
func (p *projector) announceRestoredEntitlement(ctx context.Context, key ambiguityKey, ev *event) error {
	marker := "ambiguity_opened:" + ev.ID
	if key.kind == ambiguitySubscription {
		var curSub, curStatus, curPlan, priorSub, priorStatus, priorPlan *string
		err := p.queryRow(ctx, []any{&curSub, &curStatus, &curPlan, &priorSub, &priorStatus, &priorPlan},
			sqlRestoredSubscriptionEntitlement, key.subject, key.second)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		if strPtrEqual(curSub, priorSub) && strPtrEqual(curStatus, priorStatus) && strPtrEqual(curPlan, priorPlan) {
			return nil
		}
		return p.announce(EventEntitlementChanged, key.tenant, EntitlementChanged{Tenant: key.tenant, Cause: "subscription",
			SubscriptionID: deref(priorSub), SubscriptionStatus: deref(priorStatus), Plan: priorPlan, PreviousPlan: curPlan,
			StripeEventID: marker, StripeEventCreated: key.second}, marker)
	}
	var curBilling, priorBilling *string
	var curGrace, priorGrace *time.Time
	err := p.queryRow(ctx, []any{&curBilling, &curGrace, &priorBilling, &priorGrace},
		sqlRestoredBillingEntitlement, key.customer, key.second)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return err
	}
	if strPtrEqual(curBilling, priorBilling) && sameTime(curGrace, priorGrace) {
		return nil
	}
	return p.announce(EventEntitlementChanged, key.tenant, EntitlementChanged{Tenant: key.tenant, Cause: "invoice",
		BillingStatus: deref(priorBilling), PreviousBillingStatus: deref(curBilling), GraceUntil: priorGrace,
		StripeEventID: marker, StripeEventCreated: key.second}, marker)
}

// queryRow runs one single-row query on the projector's connection and
// scans it into dest (pgx.ErrNoRows when there is none).
func (p *projector) queryRow(ctx context.Context, dest []any, sql string, args ...any) error {
	b := &pgx.Batch{}
	b.Queue(sql, args...)
	br := p.tx.SendBatch(ctx, b)
	if err := br.QueryRow().Scan(dest...); err != nil {
		br.Close()
		return err
	}
	return br.Close()
}

// ambiguityMembers returns the processed events of key's subject and second
// whose effect the restore undoes: for a subscription, its snapshots
// applied or unchanged at that second; for invoices, the customer's invoice
// outcomes at that second whose invoice row was written at that second.
func (p *projector) ambiguityMembers(ctx context.Context, key ambiguityKey, except string) ([]string, error) {
	b := &pgx.Batch{}
	b.Queue(sqlAmbiguityCandidates, key.customer, key.second, except)
	if key.kind == ambiguityInvoice {
		b.Queue(sqlInvoicesAtSecond, key.customer, key.second)
	}
	br := p.tx.SendBatch(ctx, b)
	defer br.Close()
	type candidate struct {
		id      string
		payload []byte
		outcome string
	}
	var cands []candidate
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var c candidate
		if err := rows.Scan(&c.id, &c.payload, &c.outcome); err != nil {
			rows.Close()
			return nil, err
		}
		cands = append(cands, c)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	var atSecond []string
	if key.kind == ambiguityInvoice {
		if err := br.QueryRow().Scan(&atSecond); err != nil {
			return nil, err
		}
	}
	members := []string{}
	for _, c := range cands {
		ev, err := parseEvent(c.payload)
		if err != nil {
			continue // a stored body that no longer parses was never applied
		}
		switch key.kind {
		case ambiguitySubscription:
			if ev.Kind == kindSubscription && ev.Subscription.ID == key.subject && c.outcome != string(OutcomeStale) {
				members = append(members, c.id)
			}
		default:
			if ev.Kind == kindInvoice && slices.Contains(atSecond, ev.Invoice.ID) {
				members = append(members, c.id)
			}
		}
	}
	return members, br.Close()
}

// queueMembers records ids as events of key's ambiguity.
func (p *projector) queueMembers(key ambiguityKey, ids []string) {
	p.writes.Queue(`
INSERT INTO billing_ambiguity_events (event_id, ambiguity_id, joined_at)
SELECT m, a.id, $5 FROM billing_ambiguities a, unnest($4::text[]) AS m
 WHERE a.kind = $1 AND a.subject_id = $2 AND a.event_second = $3
ON CONFLICT (event_id) DO NOTHING`, key.kind, key.subject, key.second, ids, p.now)
}

// queueSubscriptionRestore puts the subscription and the entitlement's
// subscription columns back to their prior snapshot when the row was last
// changed at key's second. A row without a prior snapshot (last changed
// before the snapshots existed) is left as it is.
func (p *projector) queueSubscriptionRestore(key ambiguityKey) {
	p.writes.Queue(`
UPDATE tenant_entitlements e
   SET subscription_id = s.prior->'entitlement'->>'subscription_id',
       subscription_status = s.prior->'entitlement'->>'subscription_status',
       plan = s.prior->'entitlement'->>'plan',
       updated_at = $3
  FROM stripe_subscriptions s
 WHERE s.subscription_id = $1 AND s.last_event_created = $2 AND s.prior IS NOT NULL
   AND e.tenant = s.tenant AND e.subscription_id = s.subscription_id`, key.subject, key.second, p.now)
	p.writes.Queue(`
DELETE FROM stripe_subscriptions
 WHERE subscription_id = $1 AND last_event_created = $2 AND jsonb_typeof(prior->'row') = 'null'`, key.subject, key.second)
	p.writes.Queue(`
UPDATE stripe_subscriptions
   SET status = prior->'row'->>'status',
       price_id = prior->'row'->>'price_id',
       plan = prior->'row'->>'plan',
       current_period_end = (prior->'row'->>'current_period_end')::timestamptz,
       cancel_at_period_end = (prior->'row'->>'cancel_at_period_end')::boolean,
       last_event_id = prior->'row'->>'last_event_id',
       last_event_created = (prior->'row'->>'last_event_created')::timestamptz,
       updated_at = $3,
       prior = NULL
 WHERE subscription_id = $1 AND last_event_created = $2 AND jsonb_typeof(prior->'row') = 'object'`, key.subject, key.second, p.now)
}

// queueInvoiceRestore puts the customer's invoice rows written at key's
// second, the customer-level status (when set at that second) and the
// tenant's billing status back to their prior snapshots.
func (p *projector) queueInvoiceRestore(key ambiguityKey) {
	p.writes.Queue(`
UPDATE tenant_entitlements e
   SET billing_status = l.invoice_status_prior->'entitlement'->>'billing_status',
       grace_until = (l.invoice_status_prior->'entitlement'->>'grace_until')::timestamptz,
       updated_at = $3
  FROM stripe_customer_links l
 WHERE l.customer_id = $1 AND l.invoice_status_event_created = $2 AND l.invoice_status_prior IS NOT NULL
   AND e.tenant = l.tenant`, key.customer, key.second, p.now)
	p.writes.Queue(`
UPDATE stripe_customer_links
   SET invoice_status = invoice_status_prior->'status'->>'invoice_status',
       invoice_status_event_id = invoice_status_prior->'status'->>'invoice_status_event_id',
       invoice_status_event_created = (invoice_status_prior->'status'->>'invoice_status_event_created')::timestamptz,
       invoice_status_prior = NULL
 WHERE customer_id = $1 AND invoice_status_event_created = $2 AND invoice_status_prior IS NOT NULL`, key.customer, key.second)
	p.writes.Queue(`
DELETE FROM stripe_invoices
 WHERE customer_id = $1 AND last_event_created = $2 AND jsonb_typeof(prior->'row') = 'null'`, key.customer, key.second)
	p.writes.Queue(`
UPDATE stripe_invoices
   SET outcome = prior->'row'->>'outcome',
       last_event_id = prior->'row'->>'last_event_id',
       last_event_created = (prior->'row'->>'last_event_created')::timestamptz,
       updated_at = $3,
       prior = NULL
 WHERE customer_id = $1 AND last_event_created = $2 AND jsonb_typeof(prior->'row') = 'object'`, key.customer, key.second, p.now)
}
