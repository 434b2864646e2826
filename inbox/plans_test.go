package inbox

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestPricePlanInputValidate(t *testing.T) {
	t.Parallel()
	ok := PricePlanInput{PriceID: "price_a", Plan: "basic", Operator: "op", Reason: "launch"}
	tests := []struct {
		name  string
		edit  func(*PricePlanInput)
		field string
	}{
		{"valid", func(*PricePlanInput) {}, ""},
		{"no price", func(in *PricePlanInput) { in.PriceID = "" }, "price id"},
		{"blank plan", func(in *PricePlanInput) { in.Plan = "  " }, "plan"},
		{"plan too long", func(in *PricePlanInput) { in.Plan = strings.Repeat("p", MaxPlanBytes+1) }, "plan"},
		{"control character", func(in *PricePlanInput) { in.PriceID = "price_\x00" }, "price id"},
		{"padded plan", func(in *PricePlanInput) { in.Plan = " basic" }, "surrounding"},
		{"no operator", func(in *PricePlanInput) { in.Operator = "" }, "operator"},
		{"no reason", func(in *PricePlanInput) { in.Reason = "" }, "reason"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := ok
			tc.edit(&in)
			err := in.Validate()
			if tc.field == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidPricePlan) || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("got %v, want ErrInvalidPricePlan naming %q", err, tc.field)
			}
		})
	}
}

// Setting a mapping is audited with operator, reason and the prior plan;
// the same plan again writes nothing; the preview writes nothing; a
// deferred unmapped event is then projected with the new plan.
func TestSetPricePlanAuditedAndUsedByTheWorker(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.mapPrice("price_other", "other") // the table is not empty: unmapped_stripe_price, not config missing
	e.linked("cus_1", "tenant_1", "sub_1")
	e.deliver(subscription(t, "customer.subscription.created", "evt_sub", t0+10, "cus_1", "sub_1", "active", "price_a"))
	e.drain()
	if r := e.row("evt_sub"); r.lastReason != string(ReasonUnmappedStripePrice) || r.processed {
		t.Fatalf("before the mapping: %+v", r)
	}

	in := PricePlanInput{PriceID: "price_a", Plan: "basic", Operator: "op_alice", Reason: "launch of basic, INC-1"}
	pre, err := PreviewPricePlan(ctx, e.pool, in)
	if err != nil || pre.PriorPlan != nil || pre.Unchanged || pre.WaitingPending != 1 || pre.WaitingDeadLetters != 0 {
		t.Fatalf("preview: %+v %v", pre, err)
	}
	if n := e.count(`SELECT count(*) FROM stripe_price_plans WHERE price_id = 'price_a'`); n != 0 {
		t.Fatal("the preview wrote")
	}
	ch, err := SetPricePlan(ctx, e.pool, e.clk, in)
	if err != nil || ch.ChangedAt == nil || ch.PriorPlan != nil || ch.Unchanged {
		t.Fatalf("set: %+v %v", ch, err)
	}
	again, err := SetPricePlan(ctx, e.pool, e.clk, in)
	if err != nil || !again.Unchanged || again.ChangedAt != nil {
		t.Fatalf("set again: %+v %v", again, err)
	}
	in.Plan, in.Reason = "pro", "basic renamed, INC-2"
	if ch, err = SetPricePlan(ctx, e.pool, e.clk, in); err != nil || deref(ch.PriorPlan) != "basic" {
		t.Fatalf("remap: %+v %v", ch, err)
	}
	if n := e.count(`SELECT count(*) FROM stripe_price_plan_changes`); n != 2 {
		t.Fatalf("%d audit rows, want 2", n)
	}
	if n := e.count(`SELECT count(*) FROM stripe_price_plan_changes
	                  WHERE price_id = 'price_a' AND prior_plan = 'basic' AND plan = 'pro' AND operator = 'op_alice' AND reason = 'basic renamed, INC-2'`); n != 1 {
		t.Fatal("the remap's audit row is missing")
	}
	plans, err := ListPricePlans(ctx, e.pool)
	if err != nil || len(plans) != 2 || plans[0].PriceID != "price_a" || plans[0].Plan != "pro" ||
		deref(plans[0].LastChangedBy) != "op_alice" || plans[1].LastChangedBy != nil {
		t.Fatalf("list: %+v %v", plans, err)
	}
	if _, err := SetPricePlan(ctx, e.pool, e.clk, PricePlanInput{PriceID: "price_a", Plan: "pro", Operator: "op"}); !errors.Is(err, ErrInvalidPricePlan) {
		t.Fatalf("no reason: %v", err)
	}

	e.clk.Advance(BackoffBase * time.Second)
	e.drain()
	if en := e.entitlement("tenant_1"); en.plan != "pro" {
		t.Fatalf("entitlement after the mapping: %+v", en)
	}
}
