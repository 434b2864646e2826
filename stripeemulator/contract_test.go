package stripeemulator_test

import (
	"errors"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/stripeemulator"
	"github.com/aurora-billing/aurora/stripeemulator/stripemocktest"
	stripe "github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/client"
)

// contractTarget is one implementation of the Stripe API under the
// contract: the emulator or stripe-mock.
type contractTarget struct {
	sc       *client.API
	meterID  string
	customer string
}

// runContract sends, through stripe-go v76, every request shape aurora uses
// and asserts each is accepted (2xx), then one malformed request that both
// implementations must refuse with 400 invalid_request_error. The same
// suite runs against the emulator and against stripe-mock, which validates
// against Stripe's OpenAPI spec: if stripe-go's shapes or ours drift from
// Stripe's, one side fails.
func runContract(t *testing.T, tg contractTarget) {
	t.Helper()
	ts := epoch.Add(-time.Hour)
	ev, err := tg.sc.BillingMeterEvents.New(func() *stripe.BillingMeterEventParams {
		p := &stripe.BillingMeterEventParams{
			EventName:  stripe.String(eventName),
			Identifier: stripe.String("77ccacd8c75a588c78de426666baa67e43c34992cb5ab11df4a94afe3e8601fc"),
			Payload:    map[string]string{"stripe_customer_id": tg.customer, "value": "25"},
			Timestamp:  stripe.Int64(ts.Unix()),
		}
		p.SetIdempotencyKey("77ccacd8c75a588c78de426666baa67e43c34992cb5ab11df4a94afe3e8601fc")
		return p
	}())
	if err != nil {
		t.Fatalf("meter event: %v", err)
	}
	if ev.Object != "billing.meter_event" || ev.EventName != eventName {
		t.Fatalf("meter event body %+v", ev)
	}

	adj, err := tg.sc.BillingMeterEventAdjustments.New(&stripe.BillingMeterEventAdjustmentParams{
		EventName: stripe.String(eventName),
		Type:      stripe.String("cancel"),
		Cancel:    &stripe.BillingMeterEventAdjustmentCancelParams{Identifier: stripe.String("77ccacd8c75a588c78de426666baa67e43c34992cb5ab11df4a94afe3e8601fc")},
	})
	if err != nil {
		t.Fatalf("adjustment: %v", err)
	}
	if adj.Object != "billing.meter_event_adjustment" || adj.Type != "cancel" {
		t.Fatalf("adjustment body %+v", adj)
	}

	hour := ts.Truncate(time.Hour)
	for _, window := range []string{"", "hour", "day"} {
		start, end := hour, hour.Add(2*time.Hour)
		if window == "day" {
			start = ts.Truncate(24 * time.Hour)
			end = start.Add(24 * time.Hour)
		}
		p := &stripe.BillingMeterEventSummaryListParams{ID: stripe.String(tg.meterID), Customer: stripe.String(tg.customer),
			StartTime: stripe.Int64(start.Unix()), EndTime: stripe.Int64(end.Unix())}
		if window != "" {
			p.ValueGroupingWindow = stripe.String(window)
		}
		it := tg.sc.BillingMeterEventSummaries.List(p)
		n := 0
		for it.Next() {
			if s := it.BillingMeterEventSummary(); s.Object != "billing.meter_event_summary" {
				t.Fatalf("summary body %+v", s)
			}
			n++
		}
		if err := it.Err(); err != nil || n == 0 {
			t.Fatalf("summaries (window %q): %d, %v", window, n, err)
		}
	}

	m, err := tg.sc.BillingMeters.New(&stripe.BillingMeterParams{
		DisplayName:        stripe.String("Storage"),
		EventName:          stripe.String("storage_gb"),
		DefaultAggregation: &stripe.BillingMeterDefaultAggregationParams{Formula: stripe.String("sum")},
		CustomerMapping:    &stripe.BillingMeterCustomerMappingParams{EventPayloadKey: stripe.String("stripe_customer_id"), Type: stripe.String("by_id")},
		ValueSettings:      &stripe.BillingMeterValueSettingsParams{EventPayloadKey: stripe.String("value")},
	})
	if err != nil {
		t.Fatalf("meter create: %v", err)
	}
	if _, err := tg.sc.BillingMeters.Get(m.ID, nil); err != nil {
		t.Fatalf("meter get: %v", err)
	}
	it := tg.sc.BillingMeters.List(&stripe.BillingMeterListParams{})
	if !it.Next() {
		t.Fatalf("meter list: %v", it.Err())
	}

	c, err := tg.sc.Customers.New(&stripe.CustomerParams{Name: stripe.String("Contract"), Email: stripe.String("c@example.test")})
	if err != nil {
		t.Fatalf("customer create: %v", err)
	}
	if _, err := tg.sc.Customers.Get(c.ID, nil); err != nil {
		t.Fatalf("customer get: %v", err)
	}

	// A parameter the endpoint does not take: both refuse it.
	bad := &stripe.BillingMeterEventParams{EventName: stripe.String(eventName), Identifier: stripe.String("bad-1"),
		Payload: map[string]string{"stripe_customer_id": tg.customer, "value": "1"}, Timestamp: stripe.Int64(ts.Unix())}
	bad.AddExtra("bogus", "1")
	_, err = tg.sc.BillingMeterEvents.New(bad)
	var se *stripe.Error
	if !errors.As(err, &se) || se.HTTPStatusCode != 400 || se.Type != stripe.ErrorTypeInvalidRequest {
		t.Fatalf("unknown parameter: want 400 invalid_request_error, got %v", err)
	}
}

func TestContractEmulator(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stripeemulator.Config{})
	runContract(t, contractTarget{sc: e.sc, meterID: e.meter.ID, customer: custA})
}

// TestContractStripeMock runs the same suite against stripe-mock, which
// validates requests against Stripe's OpenAPI spec. It is skipped, saying
// so, only when the stripe-mock binary is not on PATH (install:
// go install github.com/stripe/stripe-mock@v0.203.0).
func TestContractStripeMock(t *testing.T) {
	t.Parallel()
	url, ok := stripemocktest.Start(t)
	if !ok {
		t.Skip("stripe-mock is not on PATH, so the request shapes are not checked against Stripe's OpenAPI spec; install it with: " + stripemocktest.InstallHint)
	}
	runContract(t, contractTarget{sc: stripeClient(url, "sk_test_123", nil), meterID: "mtr_123", customer: "cus_123"})
}
