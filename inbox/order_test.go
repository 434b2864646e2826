package inbox

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/migrations/dbtest"
)

// newRealClockEnv is an env whose webhook store and worker use the database
// clock: events are claimed in the order they were received, with no tie
// broken by event id.
func newRealClockEnv(t *testing.T) *env {
	t.Helper()
	pool := dbtest.New(t)
	logs := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	e := &env{t: t, pool: pool, logs: logs}
	store := NewStore(pool, nil)
	t.Cleanup(store.Close)
	e.handler = NewHandler(store, []string{testSecret}, nil, log)
	e.worker = NewWorker(pool, WorkerConfig{BatchSize: BatchSizeMax, Log: log})
	return e
}

// snapshot is every projection, every event row's disposition and every
// ambiguity with its events, as sorted lines without wall-clock columns.
func (e *env) snapshot() string {
	e.t.Helper()
	var lines []string
	for _, q := range []string{
		`SELECT 'event ' || event_id || ' processed=' || (processed_at IS NOT NULL) || ' dead=' || (dead_letter_at IS NOT NULL) ||
		        ' reason=' || coalesce(last_reason, '-') || ' outcome=' || coalesce(outcome, '-') || ' attempts=' || attempts
		   FROM billing_events`,
		`SELECT 'subscription ' || subscription_id || ' ' || status || ' price=' || coalesce(price_id, '-') || ' plan=' || coalesce(plan, '-') ||
		        ' end=' || coalesce(current_period_end::text, '-') || ' cancel=' || cancel_at_period_end ||
		        ' last=' || last_event_id || '@' || last_event_created
		   FROM stripe_subscriptions`,
		`SELECT 'invoice ' || invoice_id || ' ' || outcome || ' sub=' || subscription_id || ' last=' || last_event_id || '@' || last_event_created
		   FROM stripe_invoices`,
		`SELECT 'link ' || customer_id || ' ' || tenant || ' status=' || coalesce(invoice_status, '-') ||
		        ' by=' || coalesce(invoice_status_event_id, '-') || '@' || coalesce(invoice_status_event_created::text, '-')
		   FROM stripe_customer_links`,
		`SELECT 'entitlement ' || tenant || ' sub=' || coalesce(subscription_id, '-') || ' status=' || coalesce(subscription_status, '-') ||
		        ' plan=' || coalesce(plan, '-') || ' billing=' || billing_status || ' grace_until=' || coalesce(grace_until::text, '-')
		   FROM tenant_entitlements`,
		`SELECT 'ambiguity ' || a.kind || ' ' || a.reason || ' ' || a.subject_id || '@' || a.event_second || ' ' || a.status ||
		        ' events=' || (SELECT string_agg(event_id, ',' ORDER BY event_id) FROM billing_ambiguity_events m WHERE m.ambiguity_id = a.id)
		   FROM billing_ambiguities a`,
	} {
		rows, err := e.pool.Query(context.Background(), q)
		if err != nil {
			e.t.Fatalf("snapshot: %v", err)
		}
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				e.t.Fatal(err)
			}
			lines = append(lines, s)
		}
		rows.Close()
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// samePair is one pair of events of one subject in one Stripe second.
type samePair struct {
	name   string
	before func(e *env) // the events before the pair, each delivered and drained
	a, b   func(e *env) []byte
	reason Reason
	kind   string
	// held: the entitlement the events before the pair established
	held entitlement
}

const pairSecond = t0 + 1000

func samePairs() []samePair {
	sub := func(typ, id, status, price string) func(e *env) []byte {
		return func(e *env) []byte {
			return subscription(e.t, typ, id, pairSecond, "cus_1", "sub_1", status, price)
		}
	}
	inv := func(layout invoiceLayout, typ, id, invoiceID string) func(e *env) []byte {
		return func(e *env) []byte {
			return invoice(e.t, layout, typ, id, pairSecond, "cus_1", invoiceID, "sub_1")
		}
	}
	activeBasic := func(e *env) {
		e.deliver(subscription(e.t, "customer.subscription.created", "evt_before", pairSecond-100, "cus_1", "sub_1", "active", "price_basic"))
		e.drain()
	}
	incomplete := func(e *env) {
		e.deliver(subscription(e.t, "customer.subscription.created", "evt_before", pairSecond-100, "cus_1", "sub_1", "incomplete", "price_basic"))
		e.drain()
	}
	withInvoice := func(typ string) func(e *env) {
		return func(e *env) {
			activeBasic(e)
			e.deliver(invoice(e.t, legacyInvoice, typ, "evt_before_inv", pairSecond-100, "cus_1", "in_0", "sub_1"))
			e.drain()
		}
	}
	graceFrom := time.Unix(pairSecond-100, 0).UTC().Add(GracePeriod)
	_ = graceFrom
	return []samePair{
		{name: "subscription updated to another plan and deleted", before: activeBasic,
			a: sub("customer.subscription.updated", "evt_a", "active", "price_pro"), b: sub("customer.subscription.deleted", "evt_b", "canceled", "price_pro"),
			reason: ReasonAmbiguousSubscriptionOrder, kind: "subscription",
			held: entitlement{subscriptionID: "sub_1", subscriptionStatus: "active", plan: "basic", billingStatus: "none"}},
		{name: "incomplete subscription updated to active and deleted", before: incomplete,
			a: sub("customer.subscription.updated", "evt_a", "active", "price_pro"), b: sub("customer.subscription.deleted", "evt_b", "canceled", "price_pro"),
			reason: ReasonAmbiguousSubscriptionOrder, kind: "subscription",
			held: entitlement{subscriptionID: "sub_1", subscriptionStatus: "incomplete", billingStatus: "none"}},
		{name: "new subscription created and deleted", before: func(*env) {},
			a: sub("customer.subscription.created", "evt_a", "active", "price_pro"), b: sub("customer.subscription.deleted", "evt_b", "canceled", "price_pro"),
			reason: ReasonAmbiguousSubscriptionOrder, kind: "subscription",
			held: entitlement{billingStatus: "none"}},
		{name: "subscription active and past_due", before: activeBasic,
			a: sub("customer.subscription.updated", "evt_a", "past_due", "price_basic"), b: sub("customer.subscription.updated", "evt_b", "unpaid", "price_basic"),
			reason: ReasonAmbiguousSubscriptionOrder, kind: "subscription",
			held: entitlement{subscriptionID: "sub_1", subscriptionStatus: "active", plan: "basic", billingStatus: "none"}},
		{name: "one invoice paid and failed (legacy layout)", before: activeBasic,
			a: inv(legacyInvoice, "invoice.paid", "evt_a", "in_1"), b: inv(legacyInvoice, "invoice.payment_failed", "evt_b", "in_1"),
			reason: ReasonAmbiguousInvoiceOrder, kind: "invoice",
			held: entitlement{subscriptionID: "sub_1", subscriptionStatus: "active", plan: "basic", billingStatus: "none"}},
		{name: "one invoice payment_succeeded and failed (basil layout) after a paid invoice", before: withInvoice("invoice.paid"),
			a: inv(basilInvoice, "invoice.payment_succeeded", "evt_a", "in_1"), b: inv(basilInvoice, "invoice.payment_failed", "evt_b", "in_1"),
			reason: ReasonAmbiguousInvoiceOrder, kind: "invoice",
			held: entitlement{subscriptionID: "sub_1", subscriptionStatus: "active", plan: "basic", billingStatus: "current"}},
		{name: "two invoices of the customer, one paid and one failed", before: activeBasic,
			a: inv(legacyInvoice, "invoice.paid", "evt_a", "in_1"), b: inv(basilInvoice, "invoice.payment_failed", "evt_b", "in_2"),
			reason: ReasonAmbiguousInvoiceOrder, kind: "invoice",
			held: entitlement{subscriptionID: "sub_1", subscriptionStatus: "active", plan: "basic", billingStatus: "none"}},
		{name: "two invoices, one paid and one failed, after a failed invoice", before: withInvoice("invoice.payment_failed"),
			a: inv(legacyInvoice, "invoice.paid", "evt_a", "in_1"), b: inv(legacyInvoice, "invoice.payment_failed", "evt_b", "in_2"),
			reason: ReasonAmbiguousInvoiceOrder, kind: "invoice",
			held: entitlement{subscriptionID: "sub_1", subscriptionStatus: "active", plan: "basic", billingStatus: "grace"}},
	}
}

// Every same-second pair the guards cover ends in the same projections,
// entitlement, dead letters and ambiguity whichever event arrives first,
// on the database clock; the entitlement is what the events before the
// pair established.
func TestSameSecondPairIsOrderIndependent(t *testing.T) {
	t.Parallel()
	for _, tc := range samePairs() {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			run := func(first, second func(e *env) []byte) (string, *env) {
				e := newRealClockEnv(t)
				e.mapPrice("price_basic", "basic")
				e.mapPrice("price_pro", "pro")
				e.linked("cus_1", "tenant_1", "sub_1")
				tc.before(e)
				e.deliver(first(e))
				e.drain()
				e.deliver(second(e))
				e.drain()
				return e.snapshot(), e
			}
			ab, e := run(tc.a, tc.b)
			ba, _ := run(tc.b, tc.a)
			if ab != ba {
				t.Fatalf("end state depends on arrival order\na then b:\n%s\n\nb then a:\n%s", ab, ba)
			}
			t.Logf("end state (either order):\n%s", ab)
			if en := e.entitlement("tenant_1"); en != tc.held {
				t.Fatalf("entitlement %+v, want held at %+v\n%s", en, tc.held, ab)
			}
			for _, id := range []string{"evt_a", "evt_b"} {
				if r := e.row(id); !r.deadLetter || r.processed || r.lastReason != string(tc.reason) {
					t.Fatalf("%s: %+v, want a dead letter %s", id, r, tc.reason)
				}
			}
			want := fmt.Sprintf("ambiguity %s %s ", tc.kind, tc.reason)
			if n := strings.Count(ab, want); n != 1 || !strings.Contains(ab, "open events=evt_a,evt_b") {
				t.Fatalf("want one open ambiguity holding both events:\n%s", ab)
			}
		})
	}
}
