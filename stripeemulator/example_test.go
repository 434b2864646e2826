package stripeemulator_test

import (
	"errors"
	"fmt"
	"net/http/httptest"
	"time"

	"github.com/aurora-billing/aurora/stripeemulator"
	stripe "github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/client"
)

// A drop after apply, the retry with the same key and body, and the
// duplicate answer once the key is forgotten: applied exactly once.
func Example() {
	now := time.Date(2026, 9, 1, 12, 0, 0, 0, time.UTC)
	emu, err := stripeemulator.New(stripeemulator.Config{Now: func() time.Time { return now }})
	if err != nil {
		panic(err)
	}
	srv := httptest.NewServer(emu)
	defer srv.Close()
	_ = emu.AddCustomer("cus_A")
	_, _ = emu.AddMeter(stripeemulator.MeterSpec{DisplayName: "API calls", EventName: "api_calls"})

	// stripe-go v76 with its own retries off; a connection per request so
	// the drop is visible (see "Go's HTTP client and dropped connections").
	b := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String(srv.URL),
		MaxNetworkRetries: stripe.Int64(0),
		HTTPClient:        noKeepAlive(),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	sc := &client.API{}
	sc.Init("sk_test_example", &stripe.Backends{API: b, Connect: b, Uploads: b})

	send := func() error {
		p := &stripe.BillingMeterEventParams{
			EventName:  stripe.String("api_calls"),
			Identifier: stripe.String("key-1"),
			Payload:    map[string]string{"stripe_customer_id": "cus_A", "value": "5"},
			Timestamp:  stripe.Int64(now.Unix()),
		}
		p.SetIdempotencyKey("key-1")
		_, err := sc.BillingMeterEvents.New(p)
		return err
	}

	emu.Script("key-1", stripeemulator.Answer{Kind: stripeemulator.AnswerDropAfterApply})
	var se *stripe.Error
	err = send()
	fmt.Println("first attempt:", err != nil && !errors.As(err, &se))
	fmt.Println("retry:", send())
	emu.ForgetIdempotencyKeys()
	err = send()
	fmt.Println("resend after the key expired:", errors.As(err, &se) && se.HTTPStatusCode == 400)
	fmt.Println("applied:", len(emu.Applied()), "duplicates:", len(emu.DuplicateApplications()))
	fmt.Println("totals:", emu.AppliedTotals())
	// Output:
	// first attempt: true
	// retry: <nil>
	// resend after the key expired: true
	// applied: 1 duplicates: 0
	// totals: map[api_calls:5]
}
