package inbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// fakeProvider answers told objects (the emulator-backed test is in
// admin/inbox_resolve_test.go; this one stays inside the module).
type fakeProvider struct {
	subs, invoices map[string]string
	calls          int
}

func (p *fakeProvider) Subscription(_ context.Context, id string) (json.RawMessage, error) {
	p.calls++
	if s, ok := p.subs[id]; ok {
		return json.RawMessage(s), nil
	}
	return nil, &ProviderError{What: "subscription " + id, Class: "HTTP 404", cause: errors.New("missing")}
}

func (p *fakeProvider) Invoice(_ context.Context, id string) (json.RawMessage, error) {
	p.calls++
	if s, ok := p.invoices[id]; ok {
		return json.RawMessage(s), nil
	}
	return nil, &ProviderError{What: "invoice " + id, Class: "HTTP 404", cause: errors.New("missing")}
}

func providerSub(id, customer, status, price string) string {
	return fmt.Sprintf(`{"id":%q,"object":"subscription","customer":%q,"status":%q,"current_period_end":1760000000,
"cancel_at_period_end":false,"items":{"object":"list","data":[{"id":"si_1","object":"subscription_item","price":{"id":%q,"object":"price"}}]}}`,
		id, customer, status, price)
}

func providerInv(id, customer, sub, status string, attempted bool) string {
	return fmt.Sprintf(`{"id":%q,"object":"invoice","customer":%q,"subscription":%q,"status":%q,"attempted":%t}`, id, customer, sub, status, attempted)
}

// subscriptionAmbiguity is an active basic subscription, then an update to
// pro and a delete in one Stripe second: one open ambiguity, the
// entitlement held at basic.
func subscriptionAmbiguity(t *testing.T) *env {
	e := newEnv(t)
	e.mapPrice("price_basic", "basic")
	e.mapPrice("price_pro", "pro")
	e.linked("cus_1", "tenant_1", "sub_1")
	e.deliver(subscription(t, "customer.subscription.created", "evt_before", pairSecond-100, "cus_1", "sub_1", "active", "price_basic"))
	e.drain()
	e.deliver(subscription(t, "customer.subscription.updated", "evt_a", pairSecond, "cus_1", "sub_1", "active", "price_pro"))
	e.deliver(subscription(t, "customer.subscription.deleted", "evt_b", pairSecond, "cus_1", "sub_1", "canceled", "price_pro"))
	e.drain()
	return e
}

func TestResolveSubscriptionFromProvider(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name, status, price string
		want                entitlement
	}{
		{"provider says canceled", "canceled", "price_pro", entitlement{subscriptionID: "sub_1", subscriptionStatus: "canceled", billingStatus: "none"}},
		{"provider says active on pro", "active", "price_pro", entitlement{subscriptionID: "sub_1", subscriptionStatus: "active", plan: "pro", billingStatus: "none"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := subscriptionAmbiguity(t)
			held := entitlement{subscriptionID: "sub_1", subscriptionStatus: "active", plan: "basic", billingStatus: "none"}
			if en := e.entitlement("tenant_1"); en != held {
				t.Fatalf("held: %+v", en)
			}
			a, err := ReadAmbiguity(ctx, e.pool, "evt_b")
			if err != nil || a.Status != "open" || a.Kind != "subscription" || a.SubscriptionID != "sub_1" || len(a.Events) != 2 ||
				a.Events[0].EventID != "evt_a" || a.Events[0].Subscription.Status != "active" || a.Events[1].Subscription.Status != "canceled" ||
				a.Held.Subscription == nil || deref(a.Held.Subscription.Plan) != "basic" {
				t.Fatalf("ambiguity: %+v %v", a, err)
			}
			if b, _ := json.Marshal(a); strings.Contains(string(b), "cus_1") {
				t.Fatalf("the ambiguity names the customer: %s", b)
			}

			p := &fakeProvider{subs: map[string]string{"sub_1": providerSub("sub_1", "cus_1", tc.status, tc.price)}}
			before := e.snapshot()
			plan, err := PlanResolution(ctx, e.pool, p, e.clk, "evt_a")
			if err != nil || plan.Would.Subscription == nil || plan.Would.Subscription.Status != tc.status ||
				deref(plan.Would.Entitlement.Plan) != tc.want.plan {
				t.Fatalf("plan: %+v %v", plan.Would, err)
			}
			if after := e.snapshot(); after != before {
				t.Fatalf("the dry run wrote:\n%s\n---\n%s", before, after)
			}

			if _, err := ApplyResolution(ctx, e.pool, p, e.clk, ResolveInput{EventID: "evt_a", Operator: "op"}); !errors.Is(err, ErrInvalidResolve) {
				t.Fatalf("no reason: %v", err)
			}
			done, err := ApplyResolution(ctx, e.pool, p, e.clk, ResolveInput{EventID: "evt_a", Operator: "op_alice", Reason: "checked in Stripe, INC-9"})
			if err != nil || done.Ambiguity.Status != "resolved" || done.Ambiguity.Resolution == nil || done.Ambiguity.Resolution.Operator != "op_alice" {
				t.Fatalf("apply: %+v %v", done.Ambiguity, err)
			}
			if en := e.entitlement("tenant_1"); en != tc.want {
				t.Fatalf("entitlement %+v, want %+v", en, tc.want)
			}
			for _, id := range []string{"evt_a", "evt_b"} {
				if r := e.row(id); !r.processed || r.deadLetter || r.outcome != string(OutcomeResolved) {
					t.Fatalf("%s: %+v", id, r)
				}
			}
			if n := e.count(`SELECT count(*) FROM billing_ambiguity_resolutions
			                  WHERE operator = 'op_alice' AND reason = 'checked in Stripe, INC-9' AND source = 'provider'
			                    AND provider_objects->'subscriptions'->'sub_1'->>'status' = $1
			                    AND projection->'subscription'->>'status' = $1`, tc.status); n != 1 {
				t.Fatal("the audit row is missing or incomplete")
			}
			if n := e.count(`SELECT count(*) FROM event_outbox WHERE event_type = 'EntitlementChanged.v1'
			                    AND payload->>'stripe_event_id' LIKE 'ambiguity_resolution:%' AND payload->>'subscription_status' = $1
			                    AND coalesce(payload->>'plan', '') = $2 AND payload->>'previous_plan' = 'basic'`, tc.status, tc.want.plan); n != 1 {
				t.Fatal("EntitlementChanged.v1 of the resolution missing")
			}
			if n := e.count(`SELECT count(*) FROM event_outbox WHERE event_type = 'SubscriptionChanged.v1' AND payload->>'stripe_event_id' LIKE 'ambiguity_resolution:%'
			                    AND payload->>'status' = $1 AND payload->>'previous_status' = 'active'`, tc.status); n != 1 {
				t.Fatal("SubscriptionChanged.v1 of the resolution missing")
			}
			if _, err := ApplyResolution(ctx, e.pool, p, e.clk, ResolveInput{EventID: "evt_b", Operator: "op", Reason: "again"}); !errors.Is(err, ErrAmbiguityResolved) {
				t.Fatalf("second resolution: %v", err)
			}

			// a late event of the resolved second changes nothing; a later
			// second applies on top of the resolution as usual
			e.deliver(subscription(t, "customer.subscription.updated", "evt_late", pairSecond, "cus_1", "sub_1", "past_due", "price_basic"))
			e.drain()
			if r := e.row("evt_late"); !r.processed || r.outcome != string(OutcomeStale) {
				t.Fatalf("late event of the second: %+v", r)
			}
			if en := e.entitlement("tenant_1"); en != tc.want {
				t.Fatalf("after a late event: %+v", en)
			}
			e.deliver(subscription(t, "customer.subscription.updated", "evt_next", pairSecond+5, "cus_1", "sub_1", "active", "price_basic"))
			e.drain()
			if en := e.entitlement("tenant_1"); en.plan != "basic" || en.subscriptionStatus != "active" {
				t.Fatalf("after a later event: %+v", en)
			}
		})
	}
}

func TestResolveInvoicesFromProvider(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		status    string
		attempted bool
		billing   string
	}{
		{"paid at Stripe", "paid", true, "current"},
		{"payment failed at Stripe", "open", true, "grace"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.mapPrice("price_basic", "basic")
			e.linked("cus_1", "tenant_1", "sub_1")
			e.deliver(subscription(t, "customer.subscription.created", "evt_before", pairSecond-100, "cus_1", "sub_1", "active", "price_basic"))
			e.drain()
			e.deliver(invoice(t, legacyInvoice, "invoice.paid", "evt_a", pairSecond, "cus_1", "in_1", "sub_1"))
			e.deliver(invoice(t, basilInvoice, "invoice.payment_failed", "evt_b", pairSecond, "cus_1", "in_1", "sub_1"))
			e.drain()
			if en := e.entitlement("tenant_1"); en.billingStatus != "none" {
				t.Fatalf("held: %+v", en)
			}
			p := &fakeProvider{invoices: map[string]string{"in_1": providerInv("in_1", "cus_1", "sub_1", tc.status, tc.attempted)}}
			plan, err := PlanResolution(ctx, e.pool, p, e.clk, "evt_b")
			if err != nil || len(plan.Would.Invoices) != 1 || plan.Would.Entitlement.BillingStatus != tc.billing {
				t.Fatalf("plan: %+v %v", plan.Would, err)
			}
			if _, err := ApplyResolution(ctx, e.pool, p, e.clk, ResolveInput{EventID: "evt_b", Operator: "op", Reason: "INC-3"}); err != nil {
				t.Fatal(err)
			}
			var billing string
			var grace *time.Time
			if err := e.pool.QueryRow(ctx, `SELECT billing_status, grace_until FROM tenant_entitlements WHERE tenant = 'tenant_1'`).Scan(&billing, &grace); err != nil {
				t.Fatal(err)
			}
			wantGrace := tc.billing == "grace"
			if billing != tc.billing || (grace != nil) != wantGrace ||
				(wantGrace && !grace.Equal(time.Unix(pairSecond, 0).Add(GracePeriod))) {
				t.Fatalf("billing %s grace %v", billing, grace)
			}
			if n := e.count(`SELECT count(*) FROM event_outbox WHERE event_type = 'EntitlementChanged.v1'
			                    AND payload->>'stripe_event_id' LIKE 'ambiguity_resolution:%' AND payload->>'billing_status' = $1
			                    AND payload->>'previous_billing_status' = 'none'`, tc.billing); n != 1 {
				t.Fatal("EntitlementChanged.v1 of the resolution missing")
			}
			if n := e.count(`SELECT count(*) FROM billing_events WHERE outcome = 'resolved'`); n != 2 {
				t.Fatalf("%d events resolved, want 2", n)
			}
		})
	}
}

// Provider states that cannot decide are refused with a reason, and
// nothing is written.
func TestResolveRefusals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := subscriptionAmbiguity(t)
	e.deliver(invoice(t, legacyInvoice, "invoice.paid", "evt_ia", pairSecond, "cus_1", "in_1", "sub_1"))
	e.deliver(invoice(t, legacyInvoice, "invoice.payment_failed", "evt_ib", pairSecond, "cus_1", "in_1", "sub_1"))
	e.drain()
	before := e.snapshot()
	for _, tc := range []struct {
		name, event string
		p           *fakeProvider
		want        error
		says        string
	}{
		{"unmapped price", "evt_a", &fakeProvider{subs: map[string]string{"sub_1": providerSub("sub_1", "cus_1", "active", "price_new")}}, ErrProviderRefused, "price_new is not mapped"},
		{"another customer", "evt_a", &fakeProvider{subs: map[string]string{"sub_1": providerSub("sub_1", "cus_2", "canceled", "price_pro")}}, ErrProviderRefused, "another customer"},
		{"another subscription", "evt_a", &fakeProvider{subs: map[string]string{"sub_1": providerSub("sub_9", "cus_1", "canceled", "price_pro")}}, ErrProviderRefused, "sub_9"},
		{"unreadable", "evt_a", &fakeProvider{subs: map[string]string{"sub_1": `{"id":"sub_1"}`}}, ErrProviderRefused, "unreadable"},
		{"provider has no such subscription", "evt_a", &fakeProvider{}, ErrProvider, "subscription sub_1"},
		{"invoice open without an attempt", "evt_ia", &fakeProvider{invoices: map[string]string{"in_1": providerInv("in_1", "cus_1", "sub_1", "open", false)}}, ErrProviderRefused, "without a payment attempt"},
		{"invoice void", "evt_ia", &fakeProvider{invoices: map[string]string{"in_1": providerInv("in_1", "cus_1", "sub_1", "void", true)}}, ErrProviderRefused, "void"},
		{"invoice of another subscription", "evt_ia", &fakeProvider{invoices: map[string]string{"in_1": providerInv("in_1", "cus_1", "sub_2", "paid", true)}}, ErrProviderRefused, "another subscription"},
		{"not ambiguous", "evt_before", &fakeProvider{}, ErrNotAmbiguous, "evt_before"},
		{"unknown event", "evt_nope", &fakeProvider{}, ErrEventNotFound, "evt_nope"},
	} {
		_, err := PlanResolution(ctx, e.pool, tc.p, e.clk, tc.event)
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.says) || strings.Contains(err.Error(), "cus_") {
			t.Errorf("%s: plan: %v, want %v saying %q", tc.name, err, tc.want, tc.says)
		}
		_, err = ApplyResolution(ctx, e.pool, tc.p, e.clk, ResolveInput{EventID: tc.event, Operator: "op", Reason: "r"})
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: apply: %v, want %v", tc.name, err, tc.want)
		}
	}
	if after := e.snapshot(); after != before {
		t.Fatalf("a refusal wrote:\n%s\n---\n%s", before, after)
	}
	if n := e.count(`SELECT count(*) FROM billing_ambiguity_resolutions`); n != 0 {
		t.Fatal("a refusal was recorded as a resolution")
	}
}
