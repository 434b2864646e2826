package chaos

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"
)

var testPlans = map[string]string{"p_basic": "basic", "p_pro": "pro"}

func checkout(id string, at int64) whEvent {
	return whEvent{ID: id, Type: whCheckout, Created: at, Customer: "cus_1", Tenant: "t1", Sub: "sub_1"}
}

func subEv(id string, at int64, status, price string) whEvent {
	return whEvent{ID: id, Type: whSubUpdated, Created: at, Customer: "cus_1", Sub: "sub_1", Status: status, Price: price, PeriodEnd: at + 100}
}

func invEv(id, typ, inv string, at int64) whEvent {
	return whEvent{ID: id, Type: typ, Created: at, Customer: "cus_1", Sub: "sub_1", Invoice: inv}
}

func TestExpectInbox(t *testing.T) {
	const week = int64(7 * 24 * 3600)
	linked := modelLink{Tenant: "t1"}
	for _, tc := range []struct {
		name string
		evs  []whEvent
		want inboxModel
	}{
		{
			name: "checkout only: linked, entitlement without plan",
			evs:  []whEvent{checkout("e1", 10)},
			want: inboxModel{Links: map[string]modelLink{"cus_1": linked},
				Ents: map[string]modelEnt{"t1": {Customer: "cus_1", Billing: "none"}}},
		},
		{
			name: "the latest subscription second wins whatever the order",
			evs:  []whEvent{checkout("e1", 10), subEv("e3", 12, "past_due", "p_pro"), subEv("e2", 11, "active", "p_basic")},
			want: inboxModel{Links: map[string]modelLink{"cus_1": linked},
				Subs: map[string]modelSub{"sub_1": {Customer: "cus_1", Tenant: "t1", snapshot: snapshot{Status: "past_due", Price: "p_pro", PeriodEnd: 112}, Plan: "pro", Created: 12, EventID: "e3"}},
				Ents: map[string]modelEnt{"t1": {Customer: "cus_1", SubID: "sub_1", SubStatus: "past_due", Plan: "pro", Billing: "none"}}},
		},
		{
			name: "a terminal status has no plan; unpaid keeps the plan on the row, grants none",
			evs:  []whEvent{checkout("e1", 10), subEv("e2", 11, "unpaid", "p_pro")},
			want: inboxModel{Links: map[string]modelLink{"cus_1": linked},
				Subs: map[string]modelSub{"sub_1": {Customer: "cus_1", Tenant: "t1", snapshot: snapshot{Status: "unpaid", Price: "p_pro", PeriodEnd: 111}, Plan: "pro", Created: 11, EventID: "e2"}},
				Ents: map[string]modelEnt{"t1": {Customer: "cus_1", SubID: "sub_1", SubStatus: "unpaid", Billing: "none"}}},
		},
		{
			name: "canceled: no plan on the row either",
			evs:  []whEvent{checkout("e1", 10), subEv("e2", 11, "canceled", "p_pro")},
			want: inboxModel{Links: map[string]modelLink{"cus_1": linked},
				Subs: map[string]modelSub{"sub_1": {Customer: "cus_1", Tenant: "t1", snapshot: snapshot{Status: "canceled", Price: "p_pro", PeriodEnd: 111}, Created: 11, EventID: "e2"}},
				Ents: map[string]modelEnt{"t1": {Customer: "cus_1", SubID: "sub_1", SubStatus: "canceled", Billing: "none"}}},
		},
		{
			name: "same-second different snapshots: held at the earlier second, both dead-lettered",
			evs: []whEvent{checkout("e1", 10), subEv("e2", 11, "active", "p_basic"),
				subEv("e4", 13, "canceled", "p_basic"), subEv("e3", 13, "active", "p_pro")},
			want: inboxModel{Links: map[string]modelLink{"cus_1": linked},
				Subs:        map[string]modelSub{"sub_1": {Customer: "cus_1", Tenant: "t1", snapshot: snapshot{Status: "active", Price: "p_basic", PeriodEnd: 111}, Plan: "basic", Created: 11, EventID: "e2"}},
				Ents:        map[string]modelEnt{"t1": {Customer: "cus_1", SubID: "sub_1", SubStatus: "active", Plan: "basic", Billing: "none"}},
				Ambiguities: map[modelAmb]bool{{Kind: "subscription", Subject: "sub_1", Second: 13}: true},
				DeadLetters: map[string]string{"e3": "ambiguous_subscription_order", "e4": "ambiguous_subscription_order"}},
		},
		{
			name: "same-second pair as the only snapshots: no row, no plan",
			evs:  []whEvent{checkout("e1", 10), subEv("e2", 11, "active", "p_basic"), subEv("e3", 11, "trialing", "p_basic")},
			want: inboxModel{Links: map[string]modelLink{"cus_1": linked},
				Ents:        map[string]modelEnt{"t1": {Customer: "cus_1", Billing: "none"}},
				Ambiguities: map[modelAmb]bool{{Kind: "subscription", Subject: "sub_1", Second: 11}: true},
				DeadLetters: map[string]string{"e2": "ambiguous_subscription_order", "e3": "ambiguous_subscription_order"}},
		},
		{
			name: "same-second identical snapshots: not ambiguous, the event id undetermined",
			evs:  []whEvent{checkout("e1", 10), subEv("e2", 11, "active", "p_basic"), subEv("e3", 11, "active", "p_basic")},
			want: inboxModel{Links: map[string]modelLink{"cus_1": linked},
				Subs: map[string]modelSub{"sub_1": {Customer: "cus_1", Tenant: "t1", snapshot: snapshot{Status: "active", Price: "p_basic", PeriodEnd: 111}, Plan: "basic", Created: 11}},
				Ents: map[string]modelEnt{"t1": {Customer: "cus_1", SubID: "sub_1", SubStatus: "active", Plan: "basic", Billing: "none"}}},
		},
		{
			name: "invoices: each row its latest outcome, billing from the customer's latest second",
			evs: []whEvent{checkout("e1", 10), invEv("e5", whInvoiceFailed, "in_b", 15), invEv("e2", whInvoiceFailed, "in_a", 12),
				invEv("e3", whInvoicePaid, "in_a", 13)},
			want: inboxModel{Links: map[string]modelLink{"cus_1": {Tenant: "t1", Status: "failed", StatusCreated: 15}},
				Invoices: map[string]modelInvoice{
					"in_a": {Customer: "cus_1", Tenant: "t1", Sub: "sub_1", Outcome: "paid", Created: 13, EventID: "e3"},
					"in_b": {Customer: "cus_1", Tenant: "t1", Sub: "sub_1", Outcome: "failed", Created: 15, EventID: "e5"}},
				Ents: map[string]modelEnt{"t1": {Customer: "cus_1", Billing: "grace", GraceUntil: 15 + week}}},
		},
		{
			name: "an older failure never undoes a later payment",
			evs:  []whEvent{checkout("e1", 10), invEv("e3", whInvoiceSucceded, "in_a", 14), invEv("e2", whInvoiceFailed, "in_b", 12)},
			want: inboxModel{Links: map[string]modelLink{"cus_1": {Tenant: "t1", Status: "paid", StatusCreated: 14}},
				Invoices: map[string]modelInvoice{
					"in_a": {Customer: "cus_1", Tenant: "t1", Sub: "sub_1", Outcome: "paid", Created: 14, EventID: "e3"},
					"in_b": {Customer: "cus_1", Tenant: "t1", Sub: "sub_1", Outcome: "failed", Created: 12, EventID: "e2"}},
				Ents: map[string]modelEnt{"t1": {Customer: "cus_1", Billing: "current"}}},
		},
		{
			name: "opposite outcomes of two invoices in one second: held, both dead-lettered",
			evs: []whEvent{checkout("e1", 10), invEv("e2", whInvoicePaid, "in_a", 12),
				invEv("e3", whInvoicePaid, "in_a", 14), invEv("e4", whInvoiceFailed, "in_b", 14)},
			want: inboxModel{Links: map[string]modelLink{"cus_1": {Tenant: "t1", Status: "paid", StatusCreated: 12}},
				Invoices:    map[string]modelInvoice{"in_a": {Customer: "cus_1", Tenant: "t1", Sub: "sub_1", Outcome: "paid", Created: 12, EventID: "e2"}},
				Ents:        map[string]modelEnt{"t1": {Customer: "cus_1", Billing: "current"}},
				Ambiguities: map[modelAmb]bool{{Kind: "invoice", Subject: "cus_1", Second: 14}: true},
				DeadLetters: map[string]string{"e3": "ambiguous_invoice_order", "e4": "ambiguous_invoice_order"}},
		},
		{
			name: "opposite outcomes of one invoice, its only second: no row, billing none",
			evs:  []whEvent{checkout("e1", 10), invEv("e2", whInvoicePaid, "in_a", 12), invEv("e3", whInvoiceFailed, "in_a", 12)},
			want: inboxModel{Links: map[string]modelLink{"cus_1": linked},
				Ents:        map[string]modelEnt{"t1": {Customer: "cus_1", Billing: "none"}},
				Ambiguities: map[modelAmb]bool{{Kind: "invoice", Subject: "cus_1", Second: 12}: true},
				DeadLetters: map[string]string{"e2": "ambiguous_invoice_order", "e3": "ambiguous_invoice_order"}},
		},
		{
			name: "paid and payment_succeeded in one second: one outcome, not ambiguous",
			evs:  []whEvent{checkout("e1", 10), invEv("e2", whInvoicePaid, "in_a", 12), invEv("e3", whInvoiceSucceded, "in_a", 12)},
			want: inboxModel{Links: map[string]modelLink{"cus_1": {Tenant: "t1", Status: "paid", StatusCreated: 12}},
				Invoices: map[string]modelInvoice{"in_a": {Customer: "cus_1", Tenant: "t1", Sub: "sub_1", Outcome: "paid", Created: 12}},
				Ents:     map[string]modelEnt{"t1": {Customer: "cus_1", Billing: "current"}}},
		},
		{
			name: "a resent id is one event; other types project nothing",
			evs: []whEvent{checkout("e1", 10), checkout("e1", 10), {ID: "e9", Type: whCustomerUpdated, Created: 11, Customer: "cus_1"},
				subEv("e2", 11, "trialing", "p_basic"), subEv("e2", 11, "trialing", "p_basic")},
			want: inboxModel{Links: map[string]modelLink{"cus_1": linked},
				Subs: map[string]modelSub{"sub_1": {Customer: "cus_1", Tenant: "t1", snapshot: snapshot{Status: "trialing", Price: "p_basic", PeriodEnd: 111}, Plan: "basic", Created: 11, EventID: "e2"}},
				Ents: map[string]modelEnt{"t1": {Customer: "cus_1", SubID: "sub_1", SubStatus: "trialing", Plan: "basic", Billing: "none"}}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := expectInbox(tc.evs, testPlans)
			want := tc.want
			for _, m := range []*inboxModel{&want} {
				if m.Links == nil {
					m.Links = map[string]modelLink{}
				}
				if m.Subs == nil {
					m.Subs = map[string]modelSub{}
				}
				if m.Invoices == nil {
					m.Invoices = map[string]modelInvoice{}
				}
				if m.Ents == nil {
					m.Ents = map[string]modelEnt{}
				}
				if m.Ambiguities == nil {
					m.Ambiguities = map[modelAmb]bool{}
				}
				if m.DeadLetters == nil {
					m.DeadLetters = map[string]string{}
				}
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("got  %+v\nwant %+v", got, want)
			}
			// the model never depends on the order the events came in
			rng := rand.New(rand.NewPCG(1, 2))
			for range 20 {
				shuffled := append([]whEvent(nil), tc.evs...)
				rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
				if again := expectInbox(shuffled, testPlans); !reflect.DeepEqual(again, got) {
					t.Fatalf("order %v: got %+v, want %+v", shuffled, again, got)
				}
			}
		})
	}
}

func TestSign(t *testing.T) {
	body := []byte(`{"id":"evt_1"}`)
	at := time.Unix(1700000000, 0)
	h := sign("whsec_x", at, body)
	ts, v1, ok := strings.Cut(h, ",v1=")
	if !ok || ts != "t=1700000000" {
		t.Fatalf("header %q", h)
	}
	mac := hmac.New(sha256.New, []byte("whsec_x"))
	mac.Write([]byte("1700000000." + string(body)))
	if v1 != hex.EncodeToString(mac.Sum(nil)) {
		t.Fatalf("v1 %q is not HMAC-SHA256 of t.payload", v1)
	}
}

// TestScriptShape: the scripts are seeded, every phase's events have
// distinct ids, phase A holds the checkout and ≥ 2 snapshots at distinct
// seconds, B's outcomes are at distinct seconds, and C's pairs sit after
// their object's latest second and conflict.
func TestScriptShape(t *testing.T) {
	if !reflect.DeepEqual(script(3, 5, 1000), script(3, 5, 1000)) {
		t.Fatal("same seed, different scripts")
	}
	pairs := 0
	for i := range 200 {
		ph := script(3, i, 1000)
		ids := map[string]bool{}
		var lastSub, lastInv int64
		subSecs, invSecs := map[int64]bool{}, map[int64]bool{}
		for p, evs := range ph {
			for _, e := range evs {
				if ids[e.ID] {
					t.Fatalf("script %d: id %s twice", i, e.ID)
				}
				ids[e.ID] = true
				if len(e.body) == 0 {
					t.Fatalf("script %d: %s has no body", i, e.ID)
				}
				switch {
				case p < 2 && e.isSub():
					if subSecs[e.Created] {
						t.Fatalf("script %d: two snapshots at %d outside phase C", i, e.Created)
					}
					subSecs[e.Created], lastSub = true, max(lastSub, e.Created)
				case p < 2 && e.isInvoice():
					if invSecs[e.Created] {
						t.Fatalf("script %d: two outcomes at %d outside phase C", i, e.Created)
					}
					invSecs[e.Created], lastInv = true, max(lastInv, e.Created)
				}
			}
		}
		if ph[0][0].Type != whCheckout || len(subSecs) < 2 || len(ph[1]) == 0 {
			t.Fatalf("script %d: phases %v", i, ph)
		}
		for k := 0; k+1 < len(ph[2]); k += 2 {
			a, b := ph[2][k], ph[2][k+1]
			pairs++
			switch {
			case a.Created != b.Created:
				t.Fatalf("script %d: pair at %d and %d", i, a.Created, b.Created)
			case a.isSub() && (a.Created <= lastSub || a.snapshot() == b.snapshot()):
				t.Fatalf("script %d: subscription pair %+v %+v", i, a, b)
			case a.isInvoice() && (a.Created <= lastInv || a.outcome() == b.outcome()):
				t.Fatalf("script %d: invoice pair %+v %+v", i, a, b)
			}
		}
	}
	if pairs < 60 {
		t.Fatalf("%d pairs in 200 scripts, want about a third of 400", pairs)
	}
}
