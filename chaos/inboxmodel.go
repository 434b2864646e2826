package chaos

import (
	"sort"
	"time"
)

// The model of the inbox's projections: what the documented rules (the
// inbox package's documentation and docs/inbox.md, "Same-second events")
// say the tables hold once every event sent has been processed, computed
// from the events alone, whatever order they arrived in. It never calls
// the inbox's code.
//
// The rules it applies:
//   - checkout.session.completed links its customer to its tenant (one
//     each way) and creates the tenant's entitlement, billing status none;
//   - a subscription's row is its snapshot of the latest Stripe second;
//     an older snapshot never overwrites a newer one; two different
//     snapshots in one second make that second ambiguous: neither decides,
//     the row and the entitlement's subscription columns stay what the
//     earlier seconds established (no row when there were none), and every
//     event of that second is dead-lettered ambiguous_subscription_order;
//   - the plan is the first price's mapped plan, none for a terminal status
//     (canceled, incomplete_expired); the entitlement grants it only under
//     active, trialing and past_due;
//   - an invoice's row is its outcome of the latest second; the customer's
//     status (and the tenant's billing status: current after paid, grace
//     until the failure's time + 7 days after failed) is the outcome of the
//     customer's latest invoice second; opposite outcomes in one second of
//     the customer's invoices make that second ambiguous: every invoice
//     row and the status stay what the earlier seconds established, and
//     every invoice event of that second is dead-lettered
//     ambiguous_invoice_order;
//   - other event types project nothing.
//
// The sender produces same-second conflicts only at an object's latest
// second and only once everything earlier of that object is processed
// (see webhooks.go): the documented rules are order-independent there.

// Event types the sender produces.
const (
	whCheckout        = "checkout.session.completed"
	whSubCreated      = "customer.subscription.created"
	whSubUpdated      = "customer.subscription.updated"
	whInvoicePaid     = "invoice.paid"
	whInvoiceSucceded = "invoice.payment_succeeded"
	whInvoiceFailed   = "invoice.payment_failed"
	whCustomerUpdated = "customer.updated"
)

// gracePeriod: how long a failed payment keeps the tenant's plan (the
// inbox's documented 7 days).
const gracePeriod = 7 * 24 * time.Hour

// whEvent is one Stripe event the sender plays, with the fields the model
// reads. Created is Unix seconds.
type whEvent struct {
	ID       string
	Type     string
	Created  int64
	Customer string
	Tenant   string // checkout: client_reference_id
	Sub      string // subscription id (checkout, subscription, invoice)
	Invoice  string
	// subscription snapshot
	Status    string
	Price     string
	PeriodEnd int64
	Cancel    bool

	body []byte // the signed body, fixed at creation: every resend is byte-identical
}

// kind of the event as the model sees it.
func (e *whEvent) isSub() bool {
	return e.Type == whSubCreated || e.Type == whSubUpdated || e.Type == "customer.subscription.deleted"
}
func (e *whEvent) isInvoice() bool {
	return e.Type == whInvoicePaid || e.Type == whInvoiceSucceded || e.Type == whInvoiceFailed
}

// outcome of an invoice event: paid or failed.
func (e *whEvent) outcome() string {
	if e.Type == whInvoiceFailed {
		return "failed"
	}
	return "paid"
}

// snapshot is the part of a subscription event the row keeps.
type snapshot struct {
	Status    string
	Price     string
	PeriodEnd int64
	Cancel    bool
}

func (e *whEvent) snapshot() snapshot {
	return snapshot{Status: e.Status, Price: e.Price, PeriodEnd: e.PeriodEnd, Cancel: e.Cancel}
}

// modelSub is a stripe_subscriptions row. EventID is "" when two events
// of one snapshot share the row's second (whichever came first is kept).
type modelSub struct {
	Customer, Tenant string
	snapshot
	Plan    string // "" = NULL
	Created int64
	EventID string
}

// modelInvoice is a stripe_invoices row.
type modelInvoice struct {
	Customer, Tenant, Sub, Outcome string
	Created                        int64
	EventID                        string // "" when not determined by the events
}

// modelLink is a stripe_customer_links row: its tenant and the
// customer-level invoice status ("" = none).
type modelLink struct {
	Tenant        string
	Status        string
	StatusCreated int64
}

// modelEnt is a tenant_entitlements row ("" = NULL; GraceUntil 0 = NULL).
type modelEnt struct {
	Customer   string
	SubID      string
	SubStatus  string
	Plan       string
	Billing    string
	GraceUntil int64
}

// modelAmb is an open billing_ambiguities row.
type modelAmb struct {
	Kind    string // subscription | invoice
	Subject string // subscription id, or customer id for invoices
	Second  int64
}

// inboxModel is the expected end state.
type inboxModel struct {
	Links       map[string]modelLink    // by customer
	Subs        map[string]modelSub     // by subscription
	Invoices    map[string]modelInvoice // by invoice
	Ents        map[string]modelEnt     // by tenant
	Ambiguities map[modelAmb]bool
	// DeadLetters: event id → reason; every other event is processed.
	DeadLetters map[string]string
}

// expectInbox computes the model of evs (each event id once; resends are
// not events) with the price → plan table plans.
func expectInbox(evs []whEvent, plans map[string]string) inboxModel {
	m := inboxModel{Links: map[string]modelLink{}, Subs: map[string]modelSub{}, Invoices: map[string]modelInvoice{},
		Ents: map[string]modelEnt{}, Ambiguities: map[modelAmb]bool{}, DeadLetters: map[string]string{}}
	seen := map[string]bool{}
	subs := map[string][]*whEvent{}     // subscription → events
	invoices := map[string][]*whEvent{} // customer → invoice events
	for i := range evs {
		e := &evs[i]
		if seen[e.ID] {
			continue
		}
		seen[e.ID] = true
		switch {
		case e.Type == whCheckout:
			m.Links[e.Customer] = modelLink{Tenant: e.Tenant}
			m.Ents[e.Tenant] = modelEnt{Customer: e.Customer, Billing: "none"}
		case e.isSub():
			subs[e.Sub] = append(subs[e.Sub], e)
		case e.isInvoice():
			invoices[e.Customer] = append(invoices[e.Customer], e)
		}
	}
	for id, es := range subs {
		var row *modelSub
		for _, sec := range bySecond(es) {
			distinct := map[snapshot]bool{}
			for _, e := range sec {
				distinct[e.snapshot()] = true
			}
			if len(distinct) > 1 {
				m.Ambiguities[modelAmb{Kind: "subscription", Subject: id, Second: sec[0].Created}] = true
				for _, e := range sec {
					m.DeadLetters[e.ID] = "ambiguous_subscription_order"
				}
				continue
			}
			e := sec[0]
			tenant := m.Links[e.Customer].Tenant
			row = &modelSub{Customer: e.Customer, Tenant: tenant, snapshot: e.snapshot(), Created: e.Created}
			if len(sec) == 1 {
				row.EventID = e.ID
			}
			if !terminalStatus(e.Status) {
				row.Plan = plans[e.Price]
			}
		}
		if row == nil {
			continue
		}
		m.Subs[id] = *row
		ent := m.Ents[row.Tenant]
		ent.SubID, ent.SubStatus, ent.Plan = id, row.Status, ""
		if entitledStatus(row.Status) {
			ent.Plan = row.Plan
		}
		m.Ents[row.Tenant] = ent
	}
	for cus, es := range invoices {
		link := m.Links[cus]
		for _, sec := range bySecond(es) {
			outcomes := map[string]bool{}
			for _, e := range sec {
				outcomes[e.outcome()] = true
			}
			if len(outcomes) > 1 {
				m.Ambiguities[modelAmb{Kind: "invoice", Subject: cus, Second: sec[0].Created}] = true
				for _, e := range sec {
					m.DeadLetters[e.ID] = "ambiguous_invoice_order"
				}
				continue
			}
			// one outcome this second: every invoice named moves to it
			perInvoice := map[string][]*whEvent{}
			for _, e := range sec {
				perInvoice[e.Invoice] = append(perInvoice[e.Invoice], e)
			}
			for inv, ies := range perInvoice {
				row := modelInvoice{Customer: cus, Tenant: link.Tenant, Sub: ies[0].Sub, Outcome: ies[0].outcome(), Created: ies[0].Created}
				if len(ies) == 1 {
					row.EventID = ies[0].ID
				}
				m.Invoices[inv] = row
			}
			link.Status, link.StatusCreated = sec[0].outcome(), sec[0].Created
		}
		m.Links[cus] = link
		if link.Status == "" {
			continue
		}
		ent := m.Ents[link.Tenant]
		ent.Billing, ent.GraceUntil = "current", 0
		if link.Status == "failed" {
			ent.Billing, ent.GraceUntil = "grace", link.StatusCreated+int64(gracePeriod/time.Second)
		}
		m.Ents[link.Tenant] = ent
	}
	return m
}

// bySecond groups es by Created, seconds ascending.
func bySecond(es []*whEvent) [][]*whEvent {
	sorted := append([]*whEvent(nil), es...)
	sort.SliceStable(sorted, func(i, j int) bool {
		if sorted[i].Created != sorted[j].Created {
			return sorted[i].Created < sorted[j].Created
		}
		return sorted[i].ID < sorted[j].ID
	})
	var out [][]*whEvent
	for _, e := range sorted {
		if n := len(out); n > 0 && out[n-1][0].Created == e.Created {
			out[n-1] = append(out[n-1], e)
		} else {
			out = append(out, []*whEvent{e})
		}
	}
	return out
}

// terminalStatus: a subscription in it has no plan and no longer competes.
func terminalStatus(s string) bool { return s == "canceled" || s == "incomplete_expired" }

// entitledStatus: the statuses under which the plan is granted.
func entitledStatus(s string) bool { return s == "active" || s == "trialing" || s == "past_due" }
