package inbox

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

const t0 = int64(1_750_000_000) // a Stripe event time; the worker's clock is separate

// linked delivers and applies a checkout linking customer to tenant.
func (e *env) linked(customer, tenant, sub string) {
	e.t.Helper()
	id := "evt_co_" + customer
	e.deliver(checkout(e.t, id, t0-100, customer, tenant, sub))
	e.drain()
	if r := e.row(id); !r.processed || r.outcome != string(OutcomeApplied) {
		e.t.Fatalf("checkout %s: %+v", id, r)
	}
}

func TestSubscriptionUpdatedBeforeCreatedEndsInNewerState(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.mapPrice("price_basic", "basic")
	e.mapPrice("price_pro", "pro")
	e.linked("cus_1", "tenant_1", "sub_1")

	e.deliver(subscription(t, "customer.subscription.updated", "evt_upd", t0+20, "cus_1", "sub_1", "active", "price_pro"))
	e.drain()
	e.deliver(subscription(t, "customer.subscription.created", "evt_cre", t0+10, "cus_1", "sub_1", "incomplete", "price_basic"))
	e.drain()

	if r := e.row("evt_cre"); !r.processed || r.outcome != string(OutcomeStale) {
		t.Fatalf("older created: %+v, want processed stale", r)
	}
	en := e.entitlement("tenant_1")
	if en.subscriptionStatus != "active" || en.plan != "pro" {
		t.Fatalf("entitlement %+v, want active/pro", en)
	}
	var status, price string
	_ = e.pool.QueryRow(context.Background(), `SELECT status, price_id FROM stripe_subscriptions WHERE subscription_id = 'sub_1'`).Scan(&status, &price)
	if status != "active" || price != "price_pro" {
		t.Fatalf("subscription %s %s", status, price)
	}
}

func TestOlderPaymentFailedNeverUndoesPaid(t *testing.T) {
	t.Parallel()
	for _, layout := range []invoiceLayout{legacyInvoice, basilInvoice} {
		t.Run(fmt.Sprintf("layout %d", layout), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.mapPrice("price_basic", "basic")
			e.linked("cus_1", "tenant_1", "sub_1")
			e.deliver(subscription(t, "customer.subscription.created", "evt_sub", t0, "cus_1", "sub_1", "active", "price_basic"))
			e.drain()

			e.deliver(invoice(t, layout, "invoice.paid", "evt_paid", t0+60, "cus_1", "in_1", "sub_1"))
			e.drain()
			e.deliver(invoice(t, layout, "invoice.payment_failed", "evt_failed", t0+30, "cus_1", "in_1", "sub_1"))
			e.drain()

			if r := e.row("evt_failed"); !r.processed || r.outcome != string(OutcomeStale) {
				t.Fatalf("older failure: %+v", r)
			}
			if en := e.entitlement("tenant_1"); en.billingStatus != "current" || en.plan != "basic" {
				t.Fatalf("entitlement %+v, want current/basic", en)
			}
			var outcome string
			_ = e.pool.QueryRow(context.Background(), `SELECT outcome FROM stripe_invoices WHERE invoice_id = 'in_1'`).Scan(&outcome)
			if outcome != "paid" {
				t.Fatalf("invoice outcome %s", outcome)
			}
			// a newer failure does apply: grace
			e.deliver(invoice(t, layout, "invoice.payment_failed", "evt_failed2", t0+90, "cus_1", "in_1", "sub_1"))
			e.drain()
			if en := e.entitlement("tenant_1"); en.billingStatus != "grace" {
				t.Fatalf("after a newer failure: %+v", en)
			}
		})
	}
}

// An earlier subscription never undoes a later invoice status: billing
// status is the invoices' alone (customer-level guard).
func TestEarlierSubscriptionNeverUndoesLaterInvoiceStatus(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.mapPrice("price_basic", "basic")
	e.linked("cus_1", "tenant_1", "sub_1")
	e.deliver(subscription(t, "customer.subscription.created", "evt_sub", t0, "cus_1", "sub_1", "past_due", "price_basic"))
	e.deliver(invoice(t, basilInvoice, "invoice.payment_failed", "evt_fail", t0+100, "cus_1", "in_1", "sub_1"))
	e.drain()
	e.deliver(subscription(t, "customer.subscription.updated", "evt_sub2", t0+50, "cus_1", "sub_1", "active", "price_basic"))
	e.drain()
	en := e.entitlement("tenant_1")
	if en.billingStatus != "grace" || en.subscriptionStatus != "active" {
		t.Fatalf("entitlement %+v, want grace with subscription active", en)
	}
	// an older invoice of another invoice id is recorded, the status kept
	e.deliver(invoice(t, legacyInvoice, "invoice.paid", "evt_old_paid", t0+80, "cus_1", "in_0", "sub_1"))
	e.drain()
	if r := e.row("evt_old_paid"); r.outcome != string(OutcomeStale) {
		t.Fatalf("older invoice: %+v", r)
	}
	if en := e.entitlement("tenant_1"); en.billingStatus != "grace" {
		t.Fatalf("older paid invoice undid the later failure: %+v", en)
	}
}

// Subscription and invoice events before checkout are postponed 60 s, then
// applied in order as soon as the checkout links the customer.
func TestEventsBeforeCheckoutAreDeferredThenAppliedInOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.mapPrice("price_basic", "basic")
	e.deliver(invoice(t, basilInvoice, "invoice.paid", "evt_inv", t0+20, "cus_1", "in_1", "sub_1"))
	e.deliver(subscription(t, "customer.subscription.created", "evt_sub", t0+10, "cus_1", "sub_1", "active", "price_basic"))
	p := e.pass()
	if p.Count(ResultDeferred) != 2 {
		t.Fatalf("first pass %+v, want 2 deferred", p.Results)
	}
	for _, id := range []string{"evt_inv", "evt_sub"} {
		r := e.row(id)
		if r.lastReason != string(ReasonCustomerNotLinked) || r.attempts != 1 || !r.nextAttemptAt.Equal(e.clk.Now().Add(60*time.Second)) {
			t.Fatalf("%s: %+v, want customer_not_linked postponed 60 s", id, r)
		}
	}
	// not due yet: nothing happens without the linkage
	e.clk.Advance(30 * time.Second)
	if p := e.pass(); p.Claimed != 0 {
		t.Fatalf("claimed before due: %+v", p.Results)
	}
	// the checkout wakes them at once (no clock advance needed): the same
	// pass applies the checkout, then the subscription, then the invoice
	// (an invoice before its subscription would defer subscription_not_linked)
	e.deliver(checkout(t, "evt_co", t0+5, "cus_1", "tenant_1", "sub_1"))
	if p := e.pass(); p.Count(ResultApplied) != 3 || p.Claimed != 3 {
		t.Fatalf("checkout pass %+v, want checkout, subscription and invoice applied", p.Results)
	}
	for _, id := range []string{"evt_inv", "evt_sub"} {
		if r := e.row(id); !r.processed || r.outcome != string(OutcomeApplied) || r.attempts != 0 {
			t.Fatalf("%s: %+v, want applied with the budget reset by the wake", id, r)
		}
	}
	en := e.entitlement("tenant_1")
	if en.plan != "basic" || en.billingStatus != "current" || en.subscriptionStatus != "active" {
		t.Fatalf("entitlement %+v", en)
	}
}

// A customer never linked spends 12 attempts with delays 60 s … 1 h, then
// is a customer_not_linked dead letter; a later linkage revives it.
func TestNeverLinkedCustomerDeadLettersAfter12Attempts(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.mapPrice("price_basic", "basic")
	e.deliver(subscription(t, "customer.subscription.created", "evt_sub", t0, "cus_x", "sub_x", "active", "price_basic"))
	wantDelays := []int{60, 120, 240, 480, 960, 1920, 3600, 3600, 3600, 3600, 3600}
	for i := 1; i <= MaxAttempts; i++ {
		if p := e.pass(); p.Claimed != 1 {
			t.Fatalf("attempt %d: claimed %d", i, p.Claimed)
		}
		r := e.row("evt_sub")
		if r.attempts != i || r.lastReason != string(ReasonCustomerNotLinked) {
			t.Fatalf("attempt %d: %+v", i, r)
		}
		if i < MaxAttempts {
			if r.deadLetter || !r.nextAttemptAt.Equal(e.clk.Now().Add(time.Duration(wantDelays[i-1])*time.Second)) {
				t.Fatalf("attempt %d: %+v, want delay %d s", i, r, wantDelays[i-1])
			}
			// one second early: not due
			e.clk.Advance(time.Duration(wantDelays[i-1])*time.Second - time.Second)
			if p := e.pass(); p.Claimed != 0 {
				t.Fatalf("attempt %d claimed early", i)
			}
			e.clk.Advance(time.Second)
		} else if !r.deadLetter {
			t.Fatalf("after %d attempts: not a dead letter: %+v", i, r)
		}
	}
	inv, err := ReadInventory(context.Background(), e.pool)
	if err != nil || inv.Pending != 0 || inv.DeadLetter != 1 || *inv.HighestAttemptCount != 12 {
		t.Fatalf("inventory %+v %v", inv, err)
	}
	// an unrelated dead letter of the same customer stays quarantined
	e.deliver(subscription(t, "customer.subscription.created", "evt_other", t0, "cus_x", "sub_y", "active", "price_basic"))
	e.exec(`UPDATE billing_events SET dead_letter_at = now(), last_reason = 'unmapped_stripe_price', attempts = 12 WHERE event_id = 'evt_other'`)

	e.deliver(checkout(t, "evt_co", t0-5, "cus_x", "tenant_x", "sub_x"))
	e.pass() // the checkout: revives evt_sub with a fresh budget
	if r := e.row("evt_sub"); r.deadLetter || r.attempts != 0 {
		t.Fatalf("linkage did not revive: %+v", r)
	}
	if r := e.row("evt_other"); !r.deadLetter || r.attempts != 12 {
		t.Fatalf("unrelated dead letter changed: %+v", r)
	}
	e.drain()
	if r := e.row("evt_sub"); !r.processed || r.outcome != string(OutcomeApplied) {
		t.Fatalf("revived event: %+v", r)
	}
}

func TestDeferralReasons(t *testing.T) {
	t.Parallel()
	t.Run("stripe_price_config_missing then mapped", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		e.linked("cus_1", "tenant_1", "sub_1")
		e.deliver(subscription(t, "customer.subscription.created", "evt_sub", t0, "cus_1", "sub_1", "active", "price_a"))
		e.pass()
		if r := e.row("evt_sub"); r.lastReason != string(ReasonStripePriceConfigMissing) || r.attempts != 1 || r.deadLetter {
			t.Fatalf("%+v", r)
		}
		e.mapPrice("price_a", "basic")
		e.clk.Advance(60 * time.Second)
		e.pass()
		if r := e.row("evt_sub"); !r.processed {
			t.Fatalf("%+v", r)
		}
	})
	t.Run("unmapped_stripe_price dead letters after 12 and needs a requeue", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		e.mapPrice("price_other", "basic")
		e.linked("cus_1", "tenant_1", "sub_1")
		e.deliver(subscription(t, "customer.subscription.created", "evt_sub", t0, "cus_1", "sub_1", "active", "price_a"))
		for i := 0; i < MaxAttempts; i++ {
			e.pass()
			e.clk.Advance(time.Hour)
		}
		r := e.row("evt_sub")
		if !r.deadLetter || r.lastReason != string(ReasonUnmappedStripePrice) || r.attempts != MaxAttempts {
			t.Fatalf("%+v", r)
		}
		// fixing the mapping alone does not replay the dead letter
		e.mapPrice("price_a", "pro")
		e.clk.Advance(time.Hour)
		if p := e.pass(); p.Claimed != 0 {
			t.Fatal("a mapping fix replayed a dead letter")
		}
		if _, err := RequeueDeadLetter(context.Background(), e.pool, e.clk, RequeueInput{EventID: "evt_sub", Operator: "alice", Reason: "price_a mapped to pro after review"}); err != nil {
			t.Fatal(err)
		}
		e.pass()
		if r := e.row("evt_sub"); !r.processed {
			t.Fatalf("%+v", r)
		}
		if en := e.entitlement("tenant_1"); en.plan != "pro" {
			t.Fatalf("%+v", en)
		}
	})
	t.Run("subscription_not_linked then subscription arrives", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		e.mapPrice("price_a", "basic")
		e.linked("cus_1", "tenant_1", "sub_1")
		e.deliver(invoice(t, legacyInvoice, "invoice.paid", "evt_inv", t0+10, "cus_1", "in_1", "sub_1"))
		e.pass()
		if r := e.row("evt_inv"); r.lastReason != string(ReasonSubscriptionNotLinked) || r.processed {
			t.Fatalf("%+v", r)
		}
		if en := e.entitlement("tenant_1"); en.billingStatus != "none" {
			t.Fatalf("granted on customer identity alone: %+v", en)
		}
		e.deliver(subscription(t, "customer.subscription.created", "evt_sub", t0, "cus_1", "sub_1", "active", "price_a"))
		e.pass()
		e.clk.Advance(60 * time.Second)
		e.pass()
		if r := e.row("evt_inv"); !r.processed || r.outcome != string(OutcomeApplied) {
			t.Fatalf("%+v", r)
		}
	})
}

// Every ambiguity rule quarantines at once with its reason, changing
// nothing. The same-second order ambiguities, which also undo the first
// event of the pair, are in order_test.go.
func TestAmbiguitiesQuarantine(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		reason Reason
		setup  func(e *env) string // returns the event id that must be quarantined
	}{
		{"second nonterminal subscription", ReasonAmbiguousMultiSubscription, func(e *env) string {
			e.deliver(subscription(e.t, "customer.subscription.created", "evt_a", t0, "cus_1", "sub_1", "active", "price_a"))
			e.drain()
			e.deliver(subscription(e.t, "customer.subscription.created", "evt_b", t0+10, "cus_1", "sub_2", "active", "price_a"))
			return "evt_b"
		}},
		{"checkout for a second subscription", ReasonAmbiguousMultiSubscription, func(e *env) string {
			e.deliver(subscription(e.t, "customer.subscription.created", "evt_a", t0, "cus_1", "sub_1", "active", "price_a"))
			e.drain()
			e.deliver(checkout(e.t, "evt_co2", t0+10, "cus_1", "tenant_1", "sub_2"))
			return "evt_co2"
		}},
		{"invoice of a subscription not persisted for the tenant", ReasonAmbiguousInvoiceSubscription, func(e *env) string {
			e.deliver(subscription(e.t, "customer.subscription.created", "evt_a", t0, "cus_1", "sub_1", "active", "price_a"))
			e.drain()
			e.deliver(invoice(e.t, basilInvoice, "invoice.paid", "evt_inv", t0+10, "cus_1", "in_1", "sub_other"))
			return "evt_inv"
		}},
		{"invoice of a canceled subscription while another is current", ReasonAmbiguousInvoiceSubscription, func(e *env) string {
			e.deliver(subscription(e.t, "customer.subscription.deleted", "evt_a", t0, "cus_1", "sub_1", "canceled", "price_a"))
			e.drain()
			e.deliver(subscription(e.t, "customer.subscription.created", "evt_b", t0+10, "cus_1", "sub_2", "active", "price_a"))
			e.drain()
			e.deliver(invoice(e.t, legacyInvoice, "invoice.paid", "evt_inv", t0+20, "cus_1", "in_1", "sub_1"))
			return "evt_inv"
		}},
		{"checkout rebinding a customer to another tenant", ReasonAmbiguousCustomerLinkage, func(e *env) string {
			e.deliver(checkout(e.t, "evt_co2", t0+10, "cus_1", "tenant_2", ""))
			return "evt_co2"
		}},
		{"checkout rebinding a tenant to another customer", ReasonAmbiguousCustomerLinkage, func(e *env) string {
			e.deliver(checkout(e.t, "evt_co2", t0+10, "cus_2", "tenant_1", ""))
			return "evt_co2"
		}},
		{"contradictory invoice subscription references", ReasonUnrecognizedStripePayload, func(e *env) string {
			body := invoice(e.t, basilInvoice, "invoice.paid", "evt_inv", t0+10, "cus_1", "in_1", "sub_1")
			e.deliver([]byte(strings.Replace(string(body), `"id":"in_1"`, `"id":"in_1","subscription":"sub_9"`, 1)))
			return "evt_inv"
		}},
		{"invalid tenant metadata", ReasonUnrecognizedStripePayload, func(e *env) string {
			body := checkout(e.t, "evt_co3", t0+10, "cus_3", "", "")
			e.deliver([]byte(strings.Replace(string(body), `"metadata":{}`, `"metadata":{"aurora_tenant":42}`, 1)))
			return "evt_co3"
		}},
		{"invalid persisted event metadata", ReasonUnrecognizedStripePayload, func(e *env) string {
			e.exec(`INSERT INTO billing_events (event_id, event_type, payload, payload_sha256, next_attempt_at) VALUES
			        ('evt_bad', 'customer.subscription.updated', '{"id":"evt_bad","object":"event","type":"customer.subscription.updated"}', '\x00', $1)`, e.clk.Now())
			return "evt_bad"
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.mapPrice("price_a", "basic")
			e.linked("cus_1", "tenant_1", "sub_1")
			id := tc.setup(e)
			before := e.entitlement("tenant_1")
			e.drain()
			r := e.row(id)
			if !r.deadLetter || r.lastReason != string(tc.reason) || r.processed {
				t.Fatalf("%s: %+v, want dead letter %s", id, r, tc.reason)
			}
			if after := e.entitlement("tenant_1"); after != before {
				t.Fatalf("a quarantined event changed the entitlement: %+v → %+v", before, after)
			}
		})
	}
}

func TestIdenticalLinkageReplayIsIdempotent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.linked("cus_1", "tenant_1", "sub_1")
	e.deliver(checkout(t, "evt_co_again", t0+10, "cus_1", "tenant_1", "sub_1"))
	e.drain()
	if r := e.row("evt_co_again"); !r.processed || r.outcome != string(OutcomeUnchanged) {
		t.Fatalf("%+v", r)
	}
	if n := e.count(`SELECT count(*) FROM stripe_customer_links`); n != 1 {
		t.Fatalf("links %d", n)
	}
}

func TestUnknownAndUnprojectedEventsAreProcessedWithoutProjection(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for i, typ := range []string{"charge.succeeded", "customer.updated", "invoice.finalized", "payment_intent.created"} {
		e.deliver(encode(t, envelope(t, fmt.Sprintf("evt_u%d", i), typ, "2020-08-27", t0, map[string]any{"id": "x_1", "customer": "cus_u"})))
	}
	// an invoice naming no subscription (Zulip bills this way) changes no status
	body := invoice(t, legacyInvoice, "invoice.paid", "evt_nosub", t0, "cus_u", "in_1", "")
	e.deliver(body)
	// a payment-mode checkout without tenant is not a plan
	e.deliver(encode(t, func() map[string]any {
		m := fixture(t, "ruby-mock.checkout.session.completed.json")
		m["id"] = "evt_pay"
		return m
	}()))
	e.drain()
	for _, id := range []string{"evt_u0", "evt_u1", "evt_u2", "evt_u3", "evt_nosub", "evt_pay"} {
		if r := e.row(id); !r.processed || r.outcome != string(OutcomeIgnored) {
			t.Fatalf("%s: %+v", id, r)
		}
	}
	for _, table := range []string{"stripe_customer_links", "stripe_subscriptions", "stripe_invoices", "tenant_entitlements"} {
		if n := e.count(`SELECT count(*) FROM ` + table); n != 0 {
			t.Fatalf("%s has %d rows", table, n)
		}
	}
}

// SQL failures roll back and spend the same budget as deferrals.
func TestFailedProjectionRollsBackAndCountsAttempts(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.mapPrice("price_a", "basic")
	e.linked("cus_1", "tenant_1", "sub_1")
	e.exec(`CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'refused'; END $$`)
	e.exec(`CREATE TRIGGER refuse BEFORE INSERT OR UPDATE ON tenant_entitlements FOR EACH ROW EXECUTE FUNCTION refuse()`)
	e.deliver(subscription(t, "customer.subscription.created", "evt_sub", t0, "cus_1", "sub_1", "active", "price_a"))
	// five deferrals first (the customer lost its price mapping), then SQL failures
	e.exec(`UPDATE billing_events SET attempts = 5, last_reason = 'unmapped_stripe_price' WHERE event_id = 'evt_sub'`)
	for i := 6; i <= MaxAttempts; i++ {
		p := e.pass()
		r := e.row("evt_sub")
		if r.attempts != i || r.lastReason != string(ReasonProjectionFailed) {
			t.Fatalf("attempt %d: %+v", i, r)
		}
		if n := e.count(`SELECT count(*) FROM stripe_subscriptions`); n != 0 {
			t.Fatal("the subscription row survived a rollback")
		}
		if i < MaxAttempts && (p.Count(ResultFailed) != 1 || r.deadLetter) {
			t.Fatalf("attempt %d: %+v %+v", i, p.Results, r)
		}
		if i == MaxAttempts && (p.Count(ResultDeadLettered) != 1 || !r.deadLetter) {
			t.Fatalf("attempt 12: %+v %+v", p.Results, r)
		}
		e.clk.Advance(time.Hour)
	}
	var class string
	_ = e.pool.QueryRow(context.Background(), `SELECT last_error FROM billing_events WHERE event_id = 'evt_sub'`).Scan(&class)
	if class != "sqlstate_P0001" {
		t.Fatalf("last_error %q", class)
	}
}

func TestCustomerAdvisoryLockHeldElsewhereSkipsThePass(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.mapPrice("price_a", "basic")
	e.linked("cus_1", "tenant_1", "sub_1")
	e.deliver(subscription(t, "customer.subscription.created", "evt_sub", t0, "cus_1", "sub_1", "active", "price_a"))
	ctx := context.Background()
	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(hashtextextended('aurora.inbox.stripe_customer:' || $1, 0))`, "cus_1"); err != nil {
		t.Fatal(err)
	}
	if p := e.pass(); p.Count(ResultSkipped) != 1 {
		t.Fatalf("%+v", p.Results)
	}
	if r := e.row("evt_sub"); r.attempts != 0 || r.processed {
		t.Fatalf("a skip counted an attempt: %+v", r)
	}
	_, _ = conn.Exec(ctx, `SELECT pg_advisory_unlock_all()`)
	conn.Release()
	if p := e.pass(); p.Count(ResultApplied) != 1 {
		t.Fatalf("%+v", p.Results)
	}
}

func TestRowLockedByAnotherReplicaIsSkipped(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.deliver(encode(t, envelope(t, "evt_x", "charge.succeeded", "2020-08-27", t0, map[string]any{"id": "ch_1"})))
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM billing_events WHERE event_id = 'evt_x' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	if p := e.pass(); p.Claimed != 0 {
		t.Fatalf("claimed a row another transaction holds: %+v", p.Results)
	}
	if r := e.row("evt_x"); r.processed || r.attempts != 0 {
		t.Fatalf("%+v", r)
	}
	_ = tx.Rollback(ctx)
	if p := e.pass(); p.Count(ResultIgnored) != 1 {
		t.Fatalf("%+v", p.Results)
	}
}

// Concurrent workers (replicas) apply every event exactly once.
func TestConcurrentWorkersApplyEachEventOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.mapPrice("price_a", "basic")
	const customers = 20
	for c := 0; c < customers; c++ {
		cus, sub := fmt.Sprintf("cus_%d", c), fmt.Sprintf("sub_%d", c)
		e.deliver(checkout(t, "evt_co_"+cus, t0, cus, "tenant_"+cus, sub))
		e.deliver(subscription(t, "customer.subscription.created", "evt_s_"+cus, t0+1, cus, sub, "active", "price_a"))
		e.deliver(invoice(t, basilInvoice, "invoice.paid", "evt_i_"+cus, t0+2, cus, "in_"+cus, sub))
	}
	done := make(chan error, 3)
	for w := 0; w < 3; w++ {
		go func() {
			wk := NewWorker(e.pool, WorkerConfig{BatchSize: 5, Clock: e.clk})
			for i := 0; i < 200; i++ {
				if _, err := wk.RunPass(context.Background()); err != nil {
					done <- err
					return
				}
				inv, _ := ReadInventory(context.Background(), e.pool)
				if inv.Pending == 0 {
					break
				}
			}
			done <- nil
		}()
	}
	for w := 0; w < 3; w++ {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	// deferrals may have pushed some rows into the future; let time pass
	for i := 0; i < 10; i++ {
		e.clk.Advance(time.Hour)
		e.drain()
	}
	if n := e.count(`SELECT count(*) FROM billing_events WHERE processed_at IS NULL`); n != 0 {
		t.Fatalf("%d unprocessed", n)
	}
	if n := e.count(`SELECT count(*) FROM tenant_entitlements WHERE plan = 'basic' AND billing_status = 'current'`); n != customers {
		t.Fatalf("%d entitled tenants, want %d", n, customers)
	}
}

func TestPassLogsOneAggregateLineWithoutCustomerData(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.mapPrice("price_a", "basic")
	e.deliver(checkout(t, "evt_co", t0, "cus_secret_1", "tenant_secret", "sub_secret"))
	e.deliver(subscription(t, "customer.subscription.created", "evt_s", t0+1, "cus_secret_1", "sub_secret", "active", "price_a"))
	e.pass() // the checkout and the subscription both apply in this pass
	e.pass() // empty pass: no line
	e.deliver(invoice(t, basilInvoice, "invoice.paid", "evt_i", t0+2, "cus_secret_1", "in_secret", "sub_secret"))
	e.pass()
	logs := e.logs.String()
	if n := strings.Count(logs, "worker.stripe_reconciliation"); n != 2 {
		t.Fatalf("%d aggregate lines, want 2:\n%s", n, logs)
	}
	if strings.Contains(logs, "cus_secret") || strings.Contains(logs, "tenant_secret") || strings.Contains(logs, "sub_secret") {
		t.Fatalf("customer data in logs:\n%s", logs)
	}
	if !contains(logs, "claimed=2", "applied=") {
		t.Fatalf("log line:\n%s", logs)
	}
}

func TestRunPollsUntilCanceled(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	w := NewWorker(e.pool, WorkerConfig{BatchSize: 1, Poll: 10 * time.Millisecond, Clock: e.clk})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	for i := 0; i < 3; i++ {
		e.deliver(encode(t, envelope(t, fmt.Sprintf("evt_run_%d", i), "charge.succeeded", "2020-08-27", t0, map[string]any{"id": "ch_1"})))
	}
	deadline := time.Now().Add(10 * time.Second)
	for e.count(`SELECT count(*) FROM billing_events WHERE processed_at IS NOT NULL`) != 3 {
		if time.Now().After(deadline) {
			t.Fatal("Run did not process the events")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// No lease: while a worker's transaction is live, no amount of elapsed time
// lets a second worker take the event; when the first worker's connection
// dies mid-projection, Postgres rolls everything back and releases the
// locks, and the attempt is counted.
func TestLiveTransactionHoldsTheEventAndACrashRollsBack(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.mapPrice("price_a", "basic")
	e.linked("cus_1", "tenant_1", "sub_1")
	e.exec(`CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(60); RETURN NEW; END $$`)
	e.exec(`CREATE TRIGGER slow BEFORE INSERT ON stripe_subscriptions FOR EACH ROW EXECUTE FUNCTION slow()`)
	e.deliver(subscription(t, "customer.subscription.created", "evt_sub", t0, "cus_1", "sub_1", "active", "price_a"))

	first := make(chan Pass, 1)
	go func() {
		p, _ := NewWorker(e.pool, WorkerConfig{Clock: e.clk}).RunPass(ctx)
		first <- p
	}()
	deadline := time.Now().Add(10 * time.Second)
	for e.count(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event = 'PgSleep'`) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the first worker never reached its projection")
		}
		time.Sleep(5 * time.Millisecond)
	}
	e.clk.Advance(24 * time.Hour)
	if p, err := NewWorker(e.pool, WorkerConfig{Clock: e.clk}).RunPass(ctx); err != nil || p.Claimed != 0 {
		t.Fatalf("a second worker took a held event: %+v %v", p.Results, err)
	}
	e.exec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND wait_event = 'PgSleep'`)
	if p := <-first; p.Count(ResultFailed) != 1 {
		t.Fatalf("first worker: %+v", p.Results)
	}
	if r := e.row("evt_sub"); r.attempts != 1 || r.lastReason != string(ReasonProjectionFailed) || r.processed {
		t.Fatalf("%+v", r)
	}
	if n := e.count(`SELECT count(*) FROM stripe_subscriptions`); n != 0 {
		t.Fatal("a crashed projection left a row")
	}
	e.exec(`DROP TRIGGER slow ON stripe_subscriptions`)
	e.clk.Advance(time.Minute)
	if p := e.pass(); p.Count(ResultApplied) != 1 {
		t.Fatalf("after the crash: %+v", p.Results)
	}
}
