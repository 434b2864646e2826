package inbox

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

// announced returns the domain events the projections wrote, oldest
// first, as type → payloads.
func (e *env) announced() map[string][]map[string]any {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT event_type, aggregate_id, payload, status FROM event_outbox ORDER BY created_at, event_id`)
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	out := map[string][]map[string]any{}
	for rows.Next() {
		var typ, agg, status string
		var payload []byte
		if err := rows.Scan(&typ, &agg, &payload, &status); err != nil {
			e.t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(payload, &m); err != nil {
			e.t.Fatal(err)
		}
		m["_aggregate"], m["_status"] = agg, status
		out[typ] = append(out[typ], m)
	}
	if err := rows.Err(); err != nil {
		e.t.Fatal(err)
	}
	return out
}

// Must show: a subscription webhook processed by the inbox produces
// SubscriptionChanged.v1 (and EntitlementChanged.v1), written in the
// projection's transaction as pending for the relay's dispatcher; no
// customer id in it.
func TestSubscriptionWebhookPublishesSubscriptionChanged(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.mapPrice("price_basic", "basic")
	e.mapPrice("price_pro", "pro")
	e.linked("cus_1", "tenant_1", "sub_1")
	if got := e.announced(); len(got) != 0 {
		t.Fatalf("a checkout announced %v", got)
	}

	e.deliver(subscription(t, "customer.subscription.created", "evt_sub", t0, "cus_1", "sub_1", "active", "price_basic"))
	e.drain()
	got := e.announced()
	sc := got[EventSubscriptionChanged]
	if len(sc) != 1 {
		t.Fatalf("SubscriptionChanged.v1: %v", got)
	}
	if sc[0]["_aggregate"] != "sub_1" || sc[0]["_status"] != "pending" || sc[0]["tenant"] != "tenant_1" || sc[0]["status"] != "active" ||
		sc[0]["plan"] != "basic" || sc[0]["stripe_event_id"] != "evt_sub" || sc[0]["previous_status"] != nil {
		t.Fatalf("SubscriptionChanged.v1 payload %v", sc[0])
	}
	ec := got[EventEntitlementChanged]
	if len(ec) != 1 || ec[0]["_aggregate"] != "tenant_1" || ec[0]["cause"] != "subscription" || ec[0]["plan"] != "basic" {
		t.Fatalf("EntitlementChanged.v1: %v", ec)
	}
	if n := e.count(`SELECT count(*) FROM event_outbox WHERE payload::text LIKE '%cus_1%'`); n != 0 {
		t.Fatalf("%d events carry the customer id", n)
	}

	// an upgrade: both again, with the previous state
	e.deliver(subscription(t, "customer.subscription.updated", "evt_up", t0+10, "cus_1", "sub_1", "active", "price_pro"))
	e.drain()
	got = e.announced()
	if sc = got[EventSubscriptionChanged]; len(sc) != 2 || sc[1]["plan"] != "pro" || sc[1]["previous_plan"] != "basic" || sc[1]["previous_status"] != "active" {
		t.Fatalf("after the upgrade: %v", sc)
	}
	if ec = got[EventEntitlementChanged]; len(ec) != 2 || ec[1]["plan"] != "pro" || ec[1]["previous_plan"] != "basic" {
		t.Fatalf("after the upgrade: %v", ec)
	}

	// a stale or identical replay announces nothing
	e.deliver(subscription(t, "customer.subscription.updated", "evt_old", t0+5, "cus_1", "sub_1", "past_due", "price_basic"))
	e.drain()
	if r := e.row("evt_old"); r.outcome != string(OutcomeStale) {
		t.Fatalf("evt_old %+v", r)
	}
	if n := e.count(`SELECT count(*) FROM event_outbox`); n != 4 {
		t.Fatalf("%d events after a stale snapshot, want 4", n)
	}
}

// A deferred or quarantined webhook announces nothing: the events ride the
// projection's batch, dropped with it.
func TestDeferredWebhookAnnouncesNothingUntilApplied(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.mapPrice("price_basic", "basic")
	e.deliver(subscription(t, "customer.subscription.created", "evt_sub", t0+10, "cus_1", "sub_1", "active", "price_basic"))
	if p := e.pass(); p.Count(ResultDeferred) != 1 {
		t.Fatalf("pass %+v, want deferred", p.Results)
	}
	if n := e.count(`SELECT count(*) FROM event_outbox`); n != 0 {
		t.Fatalf("a deferred webhook announced %d events", n)
	}
	e.deliver(checkout(t, "evt_co", t0+5, "cus_1", "tenant_1", "sub_1"))
	e.drain()
	if got := e.announced(); len(got[EventSubscriptionChanged]) != 1 {
		t.Fatalf("after the linkage: %v", got)
	}
}

// invoice.paid and invoice.payment_succeeded of one invoice announce one
// InvoicePaid.v1 (its id derives from the invoice); each failure announces
// InvoicePaymentFailed.v1; billing status changes announce
// EntitlementChanged.v1.
func TestInvoiceWebhooksPublishInvoiceEvents(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.mapPrice("price_basic", "basic")
	e.linked("cus_1", "tenant_1", "sub_1")
	e.deliver(subscription(t, "customer.subscription.created", "evt_sub", t0, "cus_1", "sub_1", "active", "price_basic"))
	e.drain()

	e.deliver(invoice(t, basilInvoice, "invoice.payment_failed", "evt_f1", t0+30, "cus_1", "in_1", "sub_1"))
	e.drain()
	e.deliver(invoice(t, basilInvoice, "invoice.paid", "evt_paid", t0+60, "cus_1", "in_1", "sub_1"))
	e.drain()
	e.deliver(invoice(t, basilInvoice, "invoice.payment_succeeded", "evt_succ", t0+61, "cus_1", "in_1", "sub_1"))
	e.drain()
	got := e.announced()
	if f := got[EventInvoicePaymentFailed]; len(f) != 1 || f[0]["_aggregate"] != "in_1" || f[0]["grace_until"] == nil || f[0]["stripe_event_id"] != "evt_f1" {
		t.Fatalf("InvoicePaymentFailed.v1: %v", f)
	}
	if p := got[EventInvoicePaid]; len(p) != 1 || p[0]["_aggregate"] != "in_1" || p[0]["tenant"] != "tenant_1" || p[0]["subscription_id"] != "sub_1" ||
		p[0]["stripe_event_id"] != "evt_paid" {
		t.Fatalf("InvoicePaid.v1 (one per invoice): %v", p)
	}
	var billing []string
	for _, m := range got[EventEntitlementChanged] {
		if m["cause"] == "invoice" {
			billing = append(billing, m["previous_billing_status"].(string)+"→"+m["billing_status"].(string))
		}
	}
	if len(billing) != 2 || billing[0] != "none→grace" || billing[1] != "grace→current" {
		t.Fatalf("billing EntitlementChanged.v1: %v", billing)
	}
}

// An invoice's amount is a non-negative int64 or absent, its currency three
// ASCII letters (read in lowercase) or absent; anything else present is a
// refusal naming the field (never the value).
func TestInvoiceAmountIsReadStrictly(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		raw         string
		amount      *int64
		bad         bool
		currency    string
		badCurrency bool
	}{
		{`{"amount_paid": 1999, "currency": "eur"}`, ptr(int64(1999)), false, "eur", false},
		{`{"amount_paid": 0, "currency": "EUR"}`, ptr(int64(0)), false, "eur", false},
		{`{"amount_paid": 0}`, ptr(int64(0)), false, "", false},
		{`{"currency": 5}`, nil, false, "", true},
		{`{"currency": null}`, nil, false, "", true},
		{`{"currency": "euro"}`, nil, false, "", true},
		{`{"currency": "e1r"}`, nil, false, "", true},
		{`{"currency": "\u00e9ur"}`, nil, false, "", true},
		{`{"amount_paid": -1}`, nil, true, "", false},
		{`{"amount_paid": "12"}`, nil, true, "", false},
		{`{"amount_paid": null}`, nil, true, "", false},
	} {
		var o struct {
			AmountPaid json.RawMessage `json:"amount_paid"`
			Currency   json.RawMessage `json:"currency"`
		}
		if err := json.Unmarshal([]byte(tc.raw), &o); err != nil {
			t.Fatal(err)
		}
		a, err := minorAmount(o.AmountPaid, "data.object.amount_paid")
		var pe *PayloadError
		if tc.bad != (err != nil) || (err != nil && (!errors.As(err, &pe) || pe.Field != "data.object.amount_paid" || pe.Code != ReasonInvalidInvoiceAmount)) {
			t.Errorf("%s: error %v, want a refusal %v", tc.raw, err, tc.bad)
		}
		cur, cerr := currencyCode(o.Currency, "data.object.currency")
		if tc.badCurrency != (cerr != nil) || (cerr != nil && (!errors.As(cerr, &pe) || pe.Field != "data.object.currency" || pe.Code != ReasonInvalidInvoiceAmount)) {
			t.Errorf("%s: currency error %v, want a refusal %v", tc.raw, cerr, tc.badCurrency)
		}
		if (a == nil) != (tc.amount == nil) || (a != nil && *a != *tc.amount) || cur != tc.currency {
			t.Errorf("%s: amount %v currency %q", tc.raw, a, cur)
		}
	}
}

func ptr[T any](v T) *T { return &v }

// A paid (or failed) invoice whose amount is present but unusable is not
// projected and not announced without its amount: it is quarantined at
// once as invalid_invoice_amount, its parse error naming the field; the
// billing status and the outbox are untouched. A good amount is announced.
func TestBadInvoiceAmountIsQuarantinedNotAnnounced(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.mapPrice("price_basic", "basic")
	e.linked("cus_1", "tenant_1", "sub_1")
	e.deliver(subscription(t, "customer.subscription.created", "evt_sub", t0, "cus_1", "sub_1", "active", "price_basic"))
	e.drain()
	withAmount := func(typ, id string, created int64, field, raw string) []byte {
		var env map[string]any
		if err := json.Unmarshal(invoice(t, basilInvoice, typ, id, created, "cus_1", "in_"+id, "sub_1"), &env); err != nil {
			t.Fatal(err)
		}
		obj := env["data"].(map[string]any)["object"].(map[string]any)
		if raw == "" {
			delete(obj, field)
		} else {
			obj[field] = json.RawMessage(raw)
		}
		return encode(t, env)
	}
	tests := []struct {
		name, typ, field, raw string
		want                  Reason // "" = applied
		amount                any    // the announced amount; nil = absent
	}{
		{"negative", "invoice.paid", "amount_paid", `-500`, ReasonInvalidInvoiceAmount, nil},
		{"a string", "invoice.paid", "amount_paid", `"12"`, ReasonInvalidInvoiceAmount, nil},
		{"exponent beyond int64", "invoice.paid", "amount_paid", `1e23`, ReasonInvalidInvoiceAmount, nil},
		{"one past int64", "invoice.paid", "amount_paid", `9223372036854775808`, ReasonInvalidInvoiceAmount, nil},
		{"a fraction", "invoice.payment_succeeded", "amount_paid", `12.5`, ReasonInvalidInvoiceAmount, nil},
		{"null", "invoice.paid", "amount_paid", `null`, ReasonInvalidInvoiceAmount, nil},
		{"a boolean", "invoice.paid", "amount_paid", `true`, ReasonInvalidInvoiceAmount, nil},
		{"an object", "invoice.paid", "amount_paid", `{"value":12}`, ReasonInvalidInvoiceAmount, nil},
		{"failed: negative amount_due", "invoice.payment_failed", "amount_due", `-1`, ReasonInvalidInvoiceAmount, nil},
		{"currency a number", "invoice.paid", "currency", `978`, ReasonInvalidInvoiceAmount, nil},
		{"currency too long", "invoice.paid", "currency", `"euro"`, ReasonInvalidInvoiceAmount, nil},
		{"currency null", "invoice.paid", "currency", `null`, ReasonInvalidInvoiceAmount, nil},
		{"good", "invoice.paid", "amount_paid", `1999`, "", float64(1999)},
		{"zero", "invoice.paid", "amount_paid", `0`, "", float64(0)},
		{"absent", "invoice.paid", "amount_paid", ``, "", nil},
	}
	created := t0 + 100
	for _, tc := range tests {
		created += 10 // each its own second: no same-second ambiguity between the cases
		id := "evt_" + strings.NewReplacer(" ", "_", ":", "").Replace(tc.name)
		body := withAmount(tc.typ, id, created, tc.field, tc.raw)
		if tc.want != "" {
			_, err := parseEvent(body)
			var pe *PayloadError
			if !errors.As(err, &pe) || pe.Field != "data.object."+tc.field || pe.Code != tc.want || quarantineReason(err) != tc.want {
				t.Fatalf("%s: parse error %v, want one naming data.object.%s", tc.name, err, tc.field)
			}
			if tc.raw != "" && strings.Contains(err.Error(), tc.raw) {
				t.Errorf("%s: the error quotes the value: %v", tc.name, err)
			}
		}
		before, outboxBefore := e.entitlement("tenant_1"), e.count(`SELECT count(*) FROM event_outbox`)
		e.deliver(body)
		e.drain()
		r := e.row(id)
		if tc.want != "" {
			if !r.deadLetter || r.lastReason != string(tc.want) || r.processed || r.attempts != 1 {
				t.Errorf("%s: %+v, want quarantined %s at once", tc.name, r, tc.want)
			}
			if after := e.entitlement("tenant_1"); after != before {
				t.Errorf("%s: a quarantined invoice changed the entitlement: %+v → %+v", tc.name, before, after)
			}
			if n := e.count(`SELECT count(*) FROM event_outbox`); n != outboxBefore {
				t.Errorf("%s: a quarantined invoice announced %d events", tc.name, n-outboxBefore)
			}
			continue
		}
		if r.outcome != string(OutcomeApplied) {
			t.Fatalf("%s: %+v, want applied", tc.name, r)
		}
		var found bool
		for _, m := range e.announced()[EventInvoicePaid] {
			if m["stripe_event_id"] == id {
				found = true
				if m["amount"] != tc.amount {
					t.Errorf("%s: announced amount %v, want %v", tc.name, m["amount"], tc.amount)
				}
			}
		}
		if !found {
			t.Errorf("%s: no InvoicePaid.v1 for %s", tc.name, id)
		}
	}
}

// Opening a same-second ambiguity restores the entitlement the events
// before that second established; when that moves the entitlement, the
// opening announces EntitlementChanged.v1 with the restored state (in the
// transaction of the restore), so a consumer that followed the first
// event's announcement does not keep an entitlement that no longer holds.
// A restore that moves nothing announces nothing.
func TestOpeningAnAmbiguityAnnouncesTheRestoredEntitlement(t *testing.T) {
	t.Parallel()
	second := time.Unix(pairSecond, 0).UTC()
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T) *env
		want  map[string]any // the announcement of the opening; nil: none
	}{
		{"subscription: pro then canceled in one second, back to basic", subscriptionAmbiguity, map[string]any{
			"cause": "subscription", "subscription_id": "sub_1", "subscription_status": "active", "plan": "basic", "previous_plan": "pro"}},
		{"invoice: paid then failed in one second, back to none", func(t *testing.T) *env {
			e := newEnv(t)
			e.mapPrice("price_basic", "basic")
			e.linked("cus_1", "tenant_1", "sub_1")
			e.deliver(subscription(t, "customer.subscription.created", "evt_before", pairSecond-100, "cus_1", "sub_1", "active", "price_basic"))
			e.drain()
			e.deliver(invoice(t, legacyInvoice, "invoice.paid", "evt_a", pairSecond, "cus_1", "in_1", "sub_1"))
			e.drain()
			e.deliver(invoice(t, basilInvoice, "invoice.payment_failed", "evt_b", pairSecond, "cus_1", "in_1", "sub_1"))
			e.drain()
			return e
		}, map[string]any{"cause": "invoice", "billing_status": "none", "previous_billing_status": "current"}},
		{"invoice: the restored billing status is the one held", func(t *testing.T) *env {
			e := newEnv(t)
			e.mapPrice("price_basic", "basic")
			e.linked("cus_1", "tenant_1", "sub_1")
			e.deliver(subscription(t, "customer.subscription.created", "evt_before", pairSecond-100, "cus_1", "sub_1", "active", "price_basic"))
			e.deliver(invoice(t, legacyInvoice, "invoice.paid", "evt_paid_before", pairSecond-50, "cus_1", "in_0", "sub_1"))
			e.drain()
			e.deliver(invoice(t, legacyInvoice, "invoice.paid", "evt_a", pairSecond, "cus_1", "in_1", "sub_1"))
			e.drain()
			e.deliver(invoice(t, basilInvoice, "invoice.payment_failed", "evt_b", pairSecond, "cus_1", "in_1", "sub_1"))
			e.drain()
			return e
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := tc.setup(t)
			for _, id := range []string{"evt_a", "evt_b"} {
				if r := e.row(id); !r.deadLetter || r.processed {
					t.Fatalf("%s: %+v, want a dead letter of the ambiguity", id, r)
				}
			}
			var opened []map[string]any
			for _, m := range e.announced()[EventEntitlementChanged] {
				if id, _ := m["stripe_event_id"].(string); strings.HasPrefix(id, "ambiguity_opened:") {
					opened = append(opened, m)
				}
			}
			if tc.want == nil {
				if len(opened) != 0 {
					t.Fatalf("a restore that moved nothing announced %v", opened)
				}
				return
			}
			if len(opened) != 1 {
				t.Fatalf("EntitlementChanged.v1 of the opening: %v", opened)
			}
			got := opened[0]
			if got["_aggregate"] != "tenant_1" || got["_status"] != "pending" || got["tenant"] != "tenant_1" ||
				got["stripe_event_id"] != "ambiguity_opened:evt_b" || got["stripe_event_created"] != second.Format(time.RFC3339) {
				t.Fatalf("EntitlementChanged.v1 of the opening: %v", got)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("%s = %v, want %v (%v)", k, got[k], v, got)
				}
			}
			if _, ok := got["grace_until"]; ok {
				t.Errorf("grace_until in %v: the restored state has none", got)
			}
			// the announced state is the projection's
			en := e.entitlement("tenant_1")
			if s, ok := tc.want["subscription_status"]; ok && (en.subscriptionStatus != s || en.plan != tc.want["plan"]) {
				t.Errorf("entitlement %+v, announced %v", en, got)
			}
			if b, ok := tc.want["billing_status"]; ok && en.billingStatus != b {
				t.Errorf("entitlement %+v, announced %v", en, got)
			}
			if n := e.count(`SELECT count(*) FROM event_outbox WHERE payload::text LIKE '%cus_1%'`); n != 0 {
				t.Fatalf("%d events carry the customer id", n)
			}
		})
	}
}
