package stripeemulator_test

import (
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/stripeemulator"
	stripe "github.com/stripe/stripe-go/v76"
)

// A told subscription and invoice are answered through stripe-go in
// Stripe's shape, replaced when told again, 404 resource_missing when never
// told; the control endpoints tell the same and refuse impossible states.
func TestToldSubscriptionsAndInvoices(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stripeemulator.Config{})
	end := epoch.Add(30 * 24 * time.Hour)
	if err := e.emu.SetSubscription(stripeemulator.SubscriptionState{ID: "sub_1", Customer: custA, Status: "active",
		PriceIDs: []string{"price_pro"}, CurrentPeriodEnd: end}); err != nil {
		t.Fatal(err)
	}
	sub, err := e.sc.Subscriptions.Get("sub_1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if sub.Status != stripe.SubscriptionStatusActive || sub.Customer.ID != custA || len(sub.Items.Data) != 1 ||
		sub.Items.Data[0].Price.ID != "price_pro" || sub.CurrentPeriodEnd != end.Unix() || sub.CancelAtPeriodEnd {
		t.Fatalf("subscription: %+v", sub)
	}
	if err := e.emu.SetSubscription(stripeemulator.SubscriptionState{ID: "sub_1", Customer: custA, Status: "canceled",
		PriceIDs: []string{"price_pro"}}); err != nil {
		t.Fatal(err)
	}
	if sub, err = e.sc.Subscriptions.Get("sub_1", nil); err != nil || sub.Status != stripe.SubscriptionStatusCanceled {
		t.Fatalf("told again: %+v %v", sub, err)
	}

	if err := e.emu.SetInvoice(stripeemulator.InvoiceState{ID: "in_1", Customer: custA, Subscription: "sub_1", Status: "open", Attempted: true}); err != nil {
		t.Fatal(err)
	}
	inv, err := e.sc.Invoices.Get("in_1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if inv.Status != stripe.InvoiceStatusOpen || !inv.Attempted || inv.Paid || inv.Subscription.ID != "sub_1" || inv.Customer.ID != custA {
		t.Fatalf("invoice: %+v", inv)
	}

	for _, get := range []func() error{
		func() error { _, err := e.sc.Subscriptions.Get("sub_never", nil); return err },
		func() error { _, err := e.sc.Invoices.Get("in_never", nil); return err },
	} {
		var se *stripe.Error
		if err := get(); !errors.As(err, &se) || se.HTTPStatusCode != http.StatusNotFound || se.Code != stripe.ErrorCodeResourceMissing {
			t.Fatalf("never told: %v", err)
		}
	}

	for _, bad := range []error{
		e.emu.SetSubscription(stripeemulator.SubscriptionState{ID: "sub_2", Customer: custA, Status: "bogus"}),
		e.emu.SetSubscription(stripeemulator.SubscriptionState{ID: "x", Customer: custA, Status: "active"}),
		e.emu.SetInvoice(stripeemulator.InvoiceState{ID: "in_2", Customer: custA, Status: "failed"}),
		e.emu.SetInvoice(stripeemulator.InvoiceState{ID: "in_2", Status: "paid"}),
	} {
		if !errors.Is(bad, stripeemulator.ErrInvalidObject) {
			t.Fatalf("impossible state accepted: %v", bad)
		}
	}

	// the control endpoints
	post := func(path string, form url.Values) int {
		t.Helper()
		resp, err := http.Post(e.srv.URL+path, "application/x-www-form-urlencoded", strings.NewReader(form.Encode()))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post("/_emulator/subscriptions", url.Values{"id": {"sub_3"}, "customer": {custB}, "status": {"past_due"},
		"price": {"price_a", "price_b"}, "cancel_at_period_end": {"true"}, "current_period_end": {"1750000000"}}); code != http.StatusOK {
		t.Fatalf("control subscription: %d", code)
	}
	if sub, err = e.sc.Subscriptions.Get("sub_3", nil); err != nil || sub.Status != stripe.SubscriptionStatusPastDue ||
		len(sub.Items.Data) != 2 || !sub.CancelAtPeriodEnd || sub.CurrentPeriodEnd != 1750000000 {
		t.Fatalf("control subscription: %+v %v", sub, err)
	}
	if code := post("/_emulator/invoices", url.Values{"id": {"in_3"}, "customer": {custB}, "subscription": {"sub_3"}, "status": {"paid"}}); code != http.StatusOK {
		t.Fatalf("control invoice: %d", code)
	}
	if inv, err = e.sc.Invoices.Get("in_3", nil); err != nil || inv.Status != stripe.InvoiceStatusPaid || !inv.Paid {
		t.Fatalf("control invoice: %+v %v", inv, err)
	}
	if code := post("/_emulator/invoices", url.Values{"id": {"in_4"}, "customer": {custB}, "status": {"paid"}, "attempted": {"maybe"}}); code != http.StatusBadRequest {
		t.Fatalf("bad control invoice: %d", code)
	}
}
