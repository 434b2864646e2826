package inbox

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// sharedStripeEvents finds the shared data folder of real Stripe event
// payloads that sits next to the checkout (…/shared/data/stripe-events),
// walking up from the package directory. A missing folder fails the test.
func sharedStripeEvents(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for d := dir; ; d = filepath.Dir(d) {
		p := filepath.Join(d, "shared", "data", "stripe-events", "stripe-ruby-mock")
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			return p
		}
		if filepath.Dir(d) == d {
			t.Fatalf("no shared/data/stripe-events/stripe-ruby-mock above %s", dir)
		}
	}
}

// realEvent reads one real payload and changes only what the scenario
// needs: the event id (the fixtures share one), the Stripe second, and for
// invoices the source subscription (the fixtures name none, and an invoice
// without a source never changes billing status). Everything else is the
// recorded body.
func realEvent(t *testing.T, dir, file, id string, created int64, subscriptionID string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	m["id"], m["created"] = id, created
	if subscriptionID != "" {
		m["data"].(map[string]any)["object"].(map[string]any)["subscription"] = subscriptionID
	}
	return encode(t, m)
}

// The real stripe-ruby-mock payloads: a subscription updated (active) and
// deleted (canceled), and one invoice paid and payment_failed, each pair
// with its `created` set equal, end the same in both orders.
func TestRealPayloadPairsAreOrderIndependent(t *testing.T) {
	t.Parallel()
	dir := sharedStripeEvents(t)
	const (
		customer = "cus_00000000000000"
		sub      = "sub_000000000000000000000000"
		price    = "price_000000000000000000000000"
		second   = int64(1648320200)
	)
	pairs := []struct {
		name   string
		a, b   [2]string // file, event id
		invSub string
		reason Reason
		held   entitlement
	}{
		{"subscription updated and deleted", [2]string{"customer.subscription.updated.json", "evt_real_updated"},
			[2]string{"customer.subscription.deleted.json", "evt_real_deleted"}, "", ReasonAmbiguousSubscriptionOrder,
			entitlement{subscriptionID: sub, subscriptionStatus: "active", plan: "basic", billingStatus: "none"}},
		{"invoice paid and payment_failed", [2]string{"invoice.paid.json", "evt_real_paid"},
			[2]string{"invoice.payment_failed.json", "evt_real_failed"}, sub, ReasonAmbiguousInvoiceOrder,
			entitlement{subscriptionID: sub, subscriptionStatus: "active", plan: "basic", billingStatus: "none"}},
	}
	for _, tc := range pairs {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			run := func(first, second2 [2]string) (string, *env) {
				e := newRealClockEnv(t)
				e.mapPrice(price, "basic")
				e.deliver(checkout(t, "evt_real_checkout", second-1000, customer, "tenant_real", sub))
				e.deliver(realEvent(t, dir, "customer.subscription.created.json", "evt_real_created", second-500, ""))
				e.drain()
				for _, ev := range [][2]string{first, second2} {
					e.deliver(realEvent(t, dir, ev[0], ev[1], second, tc.invSub))
					e.drain()
				}
				return e.snapshot(), e
			}
			ab, e := run(tc.a, tc.b)
			ba, _ := run(tc.b, tc.a)
			if ab != ba {
				t.Fatalf("end state depends on arrival order\n%s then %s:\n%s\n\nthe other order:\n%s", tc.a[1], tc.b[1], ab, ba)
			}
			t.Logf("end state (either order):\n%s", ab)
			if en := e.entitlement("tenant_real"); en != tc.held {
				t.Fatalf("entitlement %+v, want %+v", en, tc.held)
			}
			for _, id := range []string{tc.a[1], tc.b[1]} {
				if r := e.row(id); !r.deadLetter || r.lastReason != string(tc.reason) {
					t.Fatalf("%s: %+v", id, r)
				}
			}
			if !strings.Contains(ab, "open events="+minID(tc.a[1], tc.b[1])) {
				t.Fatalf("no open ambiguity with both events:\n%s", ab)
			}
		})
	}
}

func minID(a, b string) string {
	if a > b {
		a, b = b, a
	}
	return a + "," + b
}
