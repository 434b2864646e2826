package inbox

import (
	"context"
	"errors"
	"strings"
	"testing"
)

func TestOperatorInventoryInspectRequeue(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	inv, err := ReadInventory(ctx, e.pool)
	if err != nil || inv.Pending != 0 || inv.DeadLetter != 0 || inv.HighestAttemptCount != nil {
		t.Fatalf("empty inventory %+v %v", inv, err)
	}
	e.linked("cus_1", "tenant_1", "sub_1")
	e.deliver(subscription(t, "customer.subscription.created", "evt_a", t0, "cus_1", "sub_1", "active", "price_a"))
	e.deliver(subscription(t, "customer.subscription.created", "evt_b", t0+1, "cus_1", "sub_2", "active", "price_a"))
	e.mapPrice("price_a", "basic")
	e.drain()
	inv, _ = ReadInventory(ctx, e.pool)
	if inv.Pending != 0 || inv.DeadLetter != 1 || *inv.HighestAttemptCount != 1 {
		t.Fatalf("inventory %+v", inv)
	}
	dl, err := ListDeadLetters(ctx, e.pool, 100)
	if err != nil || len(dl) != 1 || dl[0].EventID != "evt_b" || deref(dl[0].LastReason) != string(ReasonAmbiguousMultiSubscription) {
		t.Fatalf("dead letters %+v %v", dl, err)
	}
	info, err := Inspect(ctx, e.pool, "evt_b", false)
	if err != nil || info.Payload != nil || info.State != StateDeadLetter {
		t.Fatalf("inspect %+v %v", info, err)
	}
	info, _ = Inspect(ctx, e.pool, "evt_b", true)
	if info.Payload == nil || !strings.Contains(*info.Payload, `"sub_2"`) {
		t.Fatal("inspect --show-payload has no payload")
	}
	if _, err := Inspect(ctx, e.pool, "evt_none", false); !errors.Is(err, ErrEventNotFound) {
		t.Fatalf("missing: %v", err)
	}

	// requeue: one row, audited, fresh budget
	for _, bad := range []RequeueInput{{EventID: "evt_b", Operator: "alice"}, {EventID: "evt_b", Reason: "x"}, {Operator: "a", Reason: "r"}} {
		if _, err := RequeueDeadLetter(ctx, e.pool, e.clk, bad); !errors.Is(err, ErrInvalidRequeue) {
			t.Fatalf("%+v: %v", bad, err)
		}
	}
	if _, err := RequeueDeadLetter(ctx, e.pool, e.clk, RequeueInput{EventID: "evt_none", Operator: "a", Reason: "r"}); !errors.Is(err, ErrEventNotFound) {
		t.Fatalf("missing: %v", err)
	}
	var se *StateError
	if _, err := RequeueDeadLetter(ctx, e.pool, e.clk, RequeueInput{EventID: "evt_a", Operator: "a", Reason: "r"}); !errors.As(err, &se) || se.State != StateProcessed || !errors.Is(err, ErrNotDeadLetter) {
		t.Fatalf("processed: %v", err)
	}
	// sub_1 was canceled at Stripe after review: the competing one is now legitimate
	e.deliver(subscription(t, "customer.subscription.deleted", "evt_del", t0+2, "cus_1", "sub_1", "canceled", "price_a"))
	e.drain()
	got, err := RequeueDeadLetter(ctx, e.pool, e.clk, RequeueInput{EventID: "evt_b", Operator: "alice", Reason: "sub_1 canceled at Stripe, INC-42"})
	if err != nil || got.State != StatePending || got.Attempts != 0 || len(got.Requeues) != 1 || got.Requeues[0].Operator != "alice" || got.Requeues[0].PriorAttempts != 1 {
		t.Fatalf("requeue %+v %v", got, err)
	}
	if n := e.count(`SELECT count(*) FROM billing_events WHERE dead_letter_at IS NULL AND processed_at IS NULL`); n != 1 {
		t.Fatalf("requeue touched %d rows", n)
	}
	e.drain()
	if r := e.row("evt_b"); !r.processed {
		t.Fatalf("%+v", r)
	}
	if en := e.entitlement("tenant_1"); en.subscriptionID != "sub_2" || en.plan != "basic" {
		t.Fatalf("%+v", en)
	}
}

func TestMetricsReadQueueGauges(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	reg := newTestRegistry()
	NewMetrics(reg, e.pool)
	e.deliver(subscription(t, "customer.subscription.created", "evt_a", t0, "cus_1", "sub_1", "active", "price_a"))
	e.deliver(encode(t, envelope(t, "evt_bad", "invoice.paid", "", t0, map[string]any{"id": "in_1"})))
	e.drain()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			for _, l := range m.GetLabel() {
				name += "|" + l.GetValue()
			}
			got[name] = m.GetGauge().GetValue()
		}
	}
	if got["aurora_inbox_pending"] != 1 || got["aurora_inbox_dead_letters|unrecognized_stripe_payload"] != 1 ||
		got["aurora_inbox_highest_attempt_count"] != 1 || got["aurora_inbox_oldest_pending_age_seconds"] < 0 {
		t.Fatalf("gauges %v", got)
	}
}
