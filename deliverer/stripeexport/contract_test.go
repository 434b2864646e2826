package stripeexport

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/deliverer"
	"github.com/aurora-billing/aurora/stripeemulator"
	"github.com/aurora-billing/aurora/stripeemulator/stripemocktest"
)

// TestContract sends the exporter's real request to the emulator and to
// stripe-mock (Stripe's OpenAPI spec, when installed): both must accept the
// shape (identifier, event_name, payload keys, timestamp, Idempotency-Key).
func TestContract(t *testing.T) {
	t.Parallel()
	req := testReq
	req.Timestamp = time.Now().Add(-time.Minute)

	emu, err := stripeemulator.New(stripeemulator.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := emu.AddMeter(stripeemulator.MeterSpec{DisplayName: "API calls", EventName: req.EventName}); err != nil {
		t.Fatal(err)
	}
	if err := emu.AddCustomer(req.Customer); err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(emu)
	defer hs.Close()
	targets := map[string]string{"emulator": hs.URL}
	if url, ok := stripemocktest.Start(t); ok {
		targets["stripe-mock"] = url
	} else {
		t.Log("stripe-mock is not on PATH: the shape is checked against the emulator only; install: " + stripemocktest.InstallHint)
	}
	for name, url := range targets {
		exp, err := New(Config{APIKey: "sk_test_123", APIBase: url}, 10*time.Second, 2)
		if err != nil {
			t.Fatal(err)
		}
		res := exp.Export(context.Background(), req)
		if res.Outcome != deliverer.OutcomeAccepted || res.HTTPStatus != 200 {
			t.Errorf("%s: %+v", name, res)
		}
	}
}
