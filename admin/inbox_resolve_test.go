package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/inbox"
	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/stripeemulator"
	"github.com/jackc/pgx/v5/pgxpool"
)

// resolveDB is an inbox database with the worker run after each delivery.
type resolveDB struct {
	t    *testing.T
	url  string
	pool *pgxpool.Pool
}

func newResolveDB(t *testing.T) *resolveDB {
	t.Helper()
	url := dbtest.NewDatabase(t)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return &resolveDB{t: t, url: url, pool: pool}
}

// deliver stores Stripe events (as the webhook does) and runs the worker
// until nothing is due.
func (d *resolveDB) deliver(events ...string) {
	d.t.Helper()
	ctx := context.Background()
	store := inbox.NewStore(d.pool, nil)
	defer store.Close()
	for _, body := range events {
		var env struct {
			ID      string `json:"id"`
			Type    string `json:"type"`
			Created int64  `json:"created"`
			Data    struct {
				Object struct {
					Customer string `json:"customer"`
				} `json:"object"`
			} `json:"data"`
		}
		if err := json.Unmarshal([]byte(body), &env); err != nil {
			d.t.Fatalf("test event: %v", err)
		}
		created := time.Unix(env.Created, 0)
		if _, err := store.Ingest(ctx, inbox.Received{EventID: env.ID, Type: env.Type, Created: &created,
			Customer: env.Data.Object.Customer, Payload: []byte(body)}); err != nil {
			d.t.Fatal(err)
		}
	}
	w := inbox.NewWorker(d.pool, inbox.WorkerConfig{})
	for i := 0; i < 10; i++ {
		p, err := w.RunPass(ctx)
		if err != nil {
			d.t.Fatal(err)
		}
		if p.Claimed == 0 {
			return
		}
	}
	d.t.Fatal("the worker kept claiming")
}

// state is every projection and disposition, for "nothing changed".
func (d *resolveDB) state() string {
	d.t.Helper()
	var s string
	err := d.pool.QueryRow(context.Background(), `
SELECT (SELECT string_agg(event_id || ':' || coalesce(outcome, '-') || ':' || (dead_letter_at IS NOT NULL), ',' ORDER BY event_id) FROM billing_events) || '|' ||
       coalesce((SELECT string_agg(subscription_id || ':' || status || ':' || coalesce(plan, '-'), ',') FROM stripe_subscriptions), '') || '|' ||
       coalesce((SELECT string_agg(invoice_id || ':' || outcome, ',') FROM stripe_invoices), '') || '|' ||
       (SELECT string_agg(tenant || ':' || coalesce(plan, '-') || ':' || coalesce(subscription_status, '-') || ':' || billing_status, ',' ORDER BY tenant) FROM tenant_entitlements) || '|' ||
       (SELECT string_agg(status, ',' ORDER BY id) FROM billing_ambiguities) || '|' ||
       (SELECT count(*) FROM billing_ambiguity_resolutions)`).Scan(&s)
	if err != nil {
		d.t.Fatal(err)
	}
	return s
}

func (d *resolveDB) entitlement(tenant string) string {
	d.t.Helper()
	var s string
	if err := d.pool.QueryRow(context.Background(), `
SELECT coalesce(plan, '-') || ' ' || coalesce(subscription_status, '-') || ' ' || billing_status
  FROM tenant_entitlements WHERE tenant = $1`, tenant).Scan(&s); err != nil {
		d.t.Fatal(err)
	}
	return s
}

const resolveSecond = int64(1_750_000_000)

func checkoutEvent(id, customer, tenant, sub string) string {
	return fmt.Sprintf(`{"id":%q,"object":"event","type":"checkout.session.completed","created":%d,"data":{"object":{"id":"cs_%s","object":"checkout.session","customer":%q,"client_reference_id":%q,"mode":"subscription","subscription":%q}}}`,
		id, resolveSecond-100, id, customer, tenant, sub)
}

func subscriptionEvent(id, typ string, created int64, customer, sub, status, price string) string {
	return fmt.Sprintf(`{"id":%q,"object":"event","type":%q,"created":%d,"data":{"object":{"id":%q,"object":"subscription","customer":%q,"status":%q,"cancel_at_period_end":false,"current_period_end":%d,"items":{"object":"list","data":[{"id":"si_1","price":{"id":%q}}]}}}}`,
		id, typ, created, sub, customer, status, created+30*86400, price)
}

func invoiceEvent(id, typ, customer, inv, sub string) string {
	return fmt.Sprintf(`{"id":%q,"object":"event","type":%q,"created":%d,"data":{"object":{"id":%q,"object":"invoice","customer":%q,"subscription":%q}}}`,
		id, typ, resolveSecond, inv, customer, sub)
}

// auroractl inbox resolve against the emulator: shown, dry run (nothing
// written), --yes (applied and audited), the entitlement following what
// Stripe was told — for a subscription pair and an invoice pair.
func TestInboxResolveFromProviderAgainstTheEmulator(t *testing.T) {
	d := newResolveDB(t)
	emu, err := stripeemulator.New(stripeemulator.Config{})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(emu)
	defer srv.Close()
	env := map[string]string{"AURORA_DATABASE_URL": d.url, "AURORA_ACTOR": "op_alice",
		"AURORA_STRIPE_API_KEY": "sk_test_resolve", "AURORA_STRIPE_API_BASE": srv.URL}
	for _, m := range [][2]string{{"price_basic", "basic"}, {"price_pro", "pro"}} {
		if code, out, errs := runCtl(t, env, "inbox", "plans", "set", "--price", m[0], "--plan", m[1], "--reason", "launch", "--yes"); code != 0 {
			t.Fatalf("plans set: %d %q %q", code, out, errs)
		}
	}
	d.deliver(checkoutEvent("evt_co_1", "cus_secret1", "tenant_1", "sub_1"), checkoutEvent("evt_co_2", "cus_secret2", "tenant_2", "sub_2"))
	d.deliver(subscriptionEvent("evt_before_1", "customer.subscription.created", resolveSecond-50, "cus_secret1", "sub_1", "active", "price_basic"),
		subscriptionEvent("evt_before_2", "customer.subscription.created", resolveSecond-50, "cus_secret2", "sub_2", "active", "price_basic"))
	// one Stripe second: an update to pro and a delete; a paid and a failed payment of one invoice
	d.deliver(subscriptionEvent("evt_upd", "customer.subscription.updated", resolveSecond, "cus_secret1", "sub_1", "active", "price_pro"),
		subscriptionEvent("evt_del", "customer.subscription.deleted", resolveSecond, "cus_secret1", "sub_1", "canceled", "price_pro"),
		invoiceEvent("evt_paid", "invoice.paid", "cus_secret2", "in_2", "sub_2"),
		invoiceEvent("evt_failed", "invoice.payment_failed", "cus_secret2", "in_2", "sub_2"))
	if got := d.entitlement("tenant_1"); got != "basic active none" {
		t.Fatalf("tenant_1 not held at basic: %s", got)
	}

	// shown, read-only, no provider call
	code, out, errs := runCtl(t, env, "inbox", "resolve", "evt_del")
	if code != 0 || !outContains(out, "ambiguous_subscription_order", "evt_upd", "evt_del", "active price price_pro", "canceled price price_pro",
		"plan basic", "--from-provider") || strings.Contains(out, "cus_secret") {
		t.Fatalf("show: %d %q %q", code, out, errs)
	}
	if code, _, _ = runCtl(t, env, "inbox", "resolve", "evt_before_1"); code != ExitStateMismatch {
		t.Fatalf("not ambiguous: %d", code)
	}
	if code, _, _ = runCtl(t, env, "inbox", "resolve", "evt_nope"); code != ExitNotFound {
		t.Fatalf("unknown: %d", code)
	}

	// never told: Stripe's 404 is not found (3, not 1 "unreachable"), naming the call, no customer id
	code, _, errs = runCtl(t, env, "inbox", "resolve", "evt_del", "--from-provider")
	if code != ExitNotFound || !strings.Contains(errs, "subscription sub_1: HTTP 404") || !strings.Contains(errs, "no such object") ||
		strings.Contains(errs, "cus_secret") {
		t.Fatalf("untold subscription: %d %q", code, errs)
	}

	if err := emu.SetSubscription(stripeemulator.SubscriptionState{ID: "sub_1", Customer: "cus_secret1", Status: "canceled", PriceIDs: []string{"price_pro"}}); err != nil {
		t.Fatal(err)
	}
	if err := emu.SetInvoice(stripeemulator.InvoiceState{ID: "in_2", Customer: "cus_secret2", Subscription: "sub_2", Status: "open", Attempted: true}); err != nil {
		t.Fatal(err)
	}

	// dry run: shows what Stripe's state would project, writes nothing
	before := d.state()
	code, out, errs = runCtl(t, env, "inbox", "resolve", "evt_upd", "--from-provider")
	if code != 0 || !outContains(out, "would project", "subscription sub_1", "canceled price price_pro", "plan -, subscription sub_1 canceled", "dry run") ||
		strings.Contains(out, "cus_secret") {
		t.Fatalf("dry run: %d %q %q", code, out, errs)
	}
	if after := d.state(); after != before {
		t.Fatalf("the dry run wrote:\n%s\n%s", before, after)
	}
	for _, args := range [][]string{
		{"inbox", "resolve", "evt_upd", "--from-provider", "--yes"}, // no reason
		{"inbox", "resolve", "evt_upd", "--reason", "r", "--yes"},   // no --from-provider
	} {
		if code, _, _ := runCtl(t, env, args...); code != ExitInvalidInput {
			t.Fatalf("%v: %d", args, code)
		}
	}

	// --yes: applied, audited, the entitlement follows Stripe
	code, out, errs = runCtl(t, env, "inbox", "resolve", "evt_upd", "--from-provider", "--reason", "Stripe shows it canceled, INC-12", "--yes")
	if code != 0 || !strings.Contains(out, "resolved ambiguity") || !strings.Contains(out, "by op_alice") {
		t.Fatalf("apply: %d %q %q", code, out, errs)
	}
	if got := d.entitlement("tenant_1"); got != "- canceled none" {
		t.Fatalf("tenant_1 after the resolution: %s", got)
	}
	var operator, reason, objStatus string
	if err := d.pool.QueryRow(context.Background(), `
SELECT r.operator, r.reason, r.provider_objects->'subscriptions'->'sub_1'->>'status'
  FROM billing_ambiguity_resolutions r JOIN billing_ambiguities a ON a.id = r.ambiguity_id
 WHERE a.subject_id = 'sub_1' AND a.status = 'resolved'`).Scan(&operator, &reason, &objStatus); err != nil ||
		operator != "op_alice" || reason != "Stripe shows it canceled, INC-12" || objStatus != "canceled" {
		t.Fatalf("audit row: %s %s %s %v", operator, reason, objStatus, err)
	}
	code, out, _ = runCtl(t, env, "inbox", "resolve", "evt_del")
	if code != 0 || !outContains(out, "status         resolved", "by op_alice from provider: Stripe shows it canceled, INC-12") {
		t.Fatalf("show resolved: %d %q", code, out)
	}
	if code, _, _ = runCtl(t, env, "inbox", "resolve", "evt_del", "--from-provider", "--reason", "again", "--yes"); code != ExitStateMismatch {
		t.Fatalf("resolve twice: %d", code)
	}

	// the invoice pair, in JSON: Stripe shows the payment failed → grace
	code, out, errs = runCtl(t, env, "inbox", "resolve", "evt_paid", "--from-provider", "--reason", "payment failed at Stripe", "--yes", "--json")
	var res struct {
		Resolved struct {
			Status string `json:"status"`
			Events []struct {
				EventID string `json:"event_id"`
				State   string `json:"state"`
			} `json:"events"`
		} `json:"resolved"`
		Projected struct {
			Invoices []struct {
				Outcome        string `json:"outcome"`
				ProviderStatus string `json:"provider_status"`
			} `json:"invoices"`
		} `json:"projected"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil || res.Resolved.Status != "resolved" || len(res.Resolved.Events) != 2 ||
		res.Resolved.Events[0].State != "processed" || len(res.Projected.Invoices) != 1 || res.Projected.Invoices[0].Outcome != "failed" ||
		res.Projected.Invoices[0].ProviderStatus != "open" || strings.Contains(out, "cus_secret") {
		t.Fatalf("invoice resolution: %d %q %q", code, out, errs)
	}
	if got := d.entitlement("tenant_2"); got != "basic active grace" {
		t.Fatalf("tenant_2 after the resolution: %s", got)
	}

	// the reads went to Stripe's GET endpoints: the untold one, the dry run and
	// the apply (a resolved ambiguity is refused before any call)
	gets := map[stripeemulator.Route]int{}
	for _, r := range emu.Requests() {
		gets[r.Route]++
	}
	if gets[stripeemulator.RouteSubscriptionGet] != 3 || gets[stripeemulator.RouteInvoiceGet] != 1 {
		t.Fatalf("provider calls: %v", gets)
	}
}

func outContains(s string, subs ...string) bool {
	for _, x := range subs {
		if !strings.Contains(s, x) {
			return false
		}
	}
	return true
}
