// Package reconcilertest runs the reconciler against the Stripe emulator
// over HTTP through stripe-go, on a real Postgres, with injected time. It
// lives in the root module because the emulator does (the reconciler module
// requires only shared and migrations).
package reconcilertest

import (
	"context"
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/deliverer"
	"github.com/aurora-billing/aurora/deliverer/stripeexport"
	"github.com/aurora-billing/aurora/inbox"
	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/reconciler"
	"github.com/aurora-billing/aurora/shared/clock"
	"github.com/aurora-billing/aurora/stripeemulator"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Account, key and webhook secret of every harness.
const (
	Account       = "acct_recon"
	APIKey        = "sk_test_reconciler"
	WebhookSecret = "whsec_reconciler"
)

// Options configure a Harness.
type Options struct {
	// Start is the clock's first instant (UTC; default 2026-09-15T08:00Z).
	Start time.Time
	// SettleLag of the reconciler; SummaryLag of the emulator.
	SettleLag, SummaryLag time.Duration
	// AsyncValidation: the emulator answers configuration causes with 200
	// and an error report, as Stripe does.
	AsyncValidation bool
	// Features metered (default api_calls).
	Features []string
}

// Harness is one database, one emulator behind an HTTP server, an inbox
// endpoint the emulator delivers thin events to, and the reconciler.
type Harness struct {
	T      testing.TB
	Ctx    context.Context
	Pool   *pgxpool.Pool
	Clock  *clock.Manual
	Emu    *stripeemulator.Emulator
	Meters map[string]string // feature → meter id
	// APIBase is the emulator's URL; DatabaseURL the harness database's.
	APIBase, DatabaseURL string
	exporter             *stripeexport.Exporter
	provider             *reconciler.StripeProvider
	opts                 Options
	worker               *inbox.Worker
}

// New builds a harness: the account confirmed, a meter per feature on the
// emulator and mapped.
func New(t testing.TB, o Options) *Harness {
	t.Helper()
	if o.Start.IsZero() {
		o.Start = time.Date(2026, 9, 15, 8, 0, 0, 0, time.UTC)
	}
	if len(o.Features) == 0 {
		o.Features = []string{"api_calls"}
	}
	h := &Harness{T: t, Ctx: context.Background(), Clock: clock.NewManual(o.Start), Meters: map[string]string{}, opts: o}
	h.DatabaseURL = dbtest.NewDatabase(t)
	pool, err := pgxpool.New(h.Ctx, h.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	h.Pool = pool
	store := inbox.NewStore(h.Pool, nil)
	t.Cleanup(store.Close)
	inboxSrv := httptest.NewServer(inbox.NewHandler(store, []string{WebhookSecret}, nil, nil))
	t.Cleanup(inboxSrv.Close)
	h.worker = inbox.NewWorker(h.Pool, inbox.WorkerConfig{BatchSize: inbox.BatchSizeMax})
	emu, err := stripeemulator.New(stripeemulator.Config{
		Now: h.Clock.Now, AsyncValidation: o.AsyncValidation,
		Reconcile: stripeemulator.ReconcileConfig{SummaryLag: o.SummaryLag, ErrorReportURL: inboxSrv.URL + inbox.WebhookPath, ErrorReportSecret: WebhookSecret},
	})
	if err != nil {
		t.Fatal(err)
	}
	h.Emu = emu
	srv := httptest.NewServer(emu)
	t.Cleanup(srv.Close)
	h.APIBase = srv.URL
	if h.exporter, err = stripeexport.New(stripeexport.Config{APIKey: APIKey, APIBase: srv.URL}, 10*time.Second, 4); err != nil {
		t.Fatal(err)
	}
	if h.provider, err = reconciler.NewStripeProvider(reconciler.StripeConfig{APIKey: APIKey, APIBase: srv.URL}, 100, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	h.Exec(`INSERT INTO stripe_accounts (account_id, mode, confirmed, confirmed_at) VALUES ($1, 'test', true, now())`, Account)
	for _, f := range o.Features {
		m, err := emu.AddMeter(stripeemulator.MeterSpec{DisplayName: f, EventName: "aurora_" + f})
		if err != nil {
			t.Fatal(err)
		}
		h.Meters[f] = m.ID
		h.Exec(`INSERT INTO meter_mappings (destination_account, feature, meter_id, event_name) VALUES ($1, $2, $3, $4)`, Account, f, m.ID, m.EventName)
	}
	return h
}

// Exec runs one statement or fails the test.
func (h *Harness) Exec(sql string, args ...any) {
	h.T.Helper()
	if _, err := h.Pool.Exec(h.Ctx, sql, args...); err != nil {
		h.T.Fatalf("exec %q: %v", sql, err)
	}
}

// Count runs a count query.
func (h *Harness) Count(sql string, args ...any) int {
	h.T.Helper()
	var n int
	if err := h.Pool.QueryRow(h.Ctx, sql, args...).Scan(&n); err != nil {
		h.T.Fatalf("count %q: %v", sql, err)
	}
	return n
}

// Customer links tenant to customer; onStripe also creates the customer at
// the emulator (false: Stripe does not know it).
func (h *Harness) Customer(tenant, customer string, onStripe bool) {
	h.T.Helper()
	if onStripe {
		if err := h.Emu.AddCustomer(customer); err != nil {
			h.T.Fatal(err)
		}
	}
	h.Exec(`INSERT INTO tenant_billing (tenant, destination_account, stripe_customer) VALUES ($1, $2, $3)`, tenant, Account, customer)
}

// Item stages an outbox item for tenant's feature (pending) and returns
// its id and idempotency key.
func (h *Harness) Item(tenant, feature, ref string, qty int64, at time.Time) (int64, string) {
	h.T.Helper()
	var id int64
	var key string
	err := h.Pool.QueryRow(h.Ctx, `INSERT INTO outbox_items (tenant, subject_kind, subject_ref, exporter, destination_account, mode,
			mapping_version, feature, quantity, occurred_at, period_start)
		VALUES ($1, 'event', $2, 'stripe_meter_events', $3, 'test', 1, $4, $5, $6, date_trunc('day', $6::timestamptz))
		RETURNING id, idempotency_key`, tenant, ref, Account, feature, qty, at).Scan(&id, &key)
	if err != nil {
		h.T.Fatalf("stage: %v", err)
	}
	return id, key
}

// Send stages an item and delivers it as the deliverer does: the meter
// event through stripe-go to the emulator with the item's key, then the
// outcome written fenced by the lease token with an attempt row at the
// clock's now. It fails the test unless the answer is accepted.
func (h *Harness) Send(tenant, feature, ref string, qty int64, at time.Time) int64 {
	h.T.Helper()
	id, key := h.Item(tenant, feature, ref, qty, at)
	var customer, event string
	if err := h.Pool.QueryRow(h.Ctx, `SELECT tb.stripe_customer, m.event_name FROM tenant_billing tb, meter_mappings m
		WHERE tb.tenant = $1 AND tb.destination_account = $2 AND m.destination_account = $2 AND m.feature = $3`, tenant, Account, feature).
		Scan(&customer, &event); err != nil {
		h.T.Fatalf("send: mapping: %v", err)
	}
	res := h.exporter.Export(h.Ctx, deliverer.Request{ItemID: id, Key: key, EventName: event, CustomerKey: "stripe_customer_id",
		ValueKey: "value", Customer: customer, Value: qty, Timestamp: at})
	if res.Outcome != deliverer.OutcomeAccepted {
		h.T.Fatalf("send %s: %s (%s %d)", ref, res.Outcome, res.Rule, res.HTTPStatus)
	}
	h.Accept(id, res.RequestID)
	return id
}

// Accept writes id accepted as the deliverer would, at the clock's now.
func (h *Harness) Accept(id int64, requestID string) {
	h.T.Helper()
	now := h.Clock.Now()
	h.Exec(`UPDATE outbox_items SET state = 'accepted', lease_token = lease_token + 1, attempts = attempts + 1,
		first_attempt_at = coalesce(first_attempt_at, $2), provider_ref = nullif($3, '') WHERE id = $1`, id, now, requestID)
	h.Exec(`INSERT INTO outbox_attempts (item_id, attempt, lease_token, started_at, finished_at, outcome, http_status, stripe_request_id)
		SELECT id, attempts, lease_token, $2, $2, 'accepted', 200, nullif($3, '') FROM outbox_items WHERE id = $1`, id, now, requestID)
}

// Run is one provider run at the clock's now.
func (h *Harness) Run() reconciler.RunReport {
	h.T.Helper()
	rep, err := h.Reconciler().Run(h.Ctx)
	if err != nil {
		h.T.Fatalf("run: %v", err)
	}
	return rep
}

// Reconciler returns the reconciler on the harness's clock.
func (h *Harness) Reconciler() *reconciler.Reconciler {
	return reconciler.New(h.Pool, h.provider, reconciler.Options{Account: Account, SettleLag: h.opts.SettleLag, Now: h.Clock.Now})
}

// FlushReports delivers the emulator's error reports to the inbox and
// runs its worker over them.
func (h *Harness) FlushReports() []string {
	h.T.Helper()
	ids, err := h.Emu.FlushErrorReports(h.Ctx)
	if err != nil {
		h.T.Fatalf("flush error reports: %v", err)
	}
	for i := 0; i < 10; i++ {
		p, err := h.worker.RunPass(h.Ctx)
		if err != nil {
			h.T.Fatal(err)
		}
		if p.Claimed == 0 {
			break
		}
	}
	return ids
}

// Open returns the open reconciliation items.
func (h *Harness) Open() []reconciler.Item {
	h.T.Helper()
	items, err := reconciler.ListItems(h.Ctx, h.Pool, reconciler.StateOpen, reconciler.MaxLimit)
	if err != nil {
		h.T.Fatal(err)
	}
	return items
}

// States counts items by state.
func (h *Harness) States() map[string]int {
	h.T.Helper()
	rows, err := h.Pool.Query(h.Ctx, `SELECT state, count(*) FROM outbox_items GROUP BY state`)
	if err != nil {
		h.T.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			h.T.Fatal(err)
		}
		out[s] = n
	}
	return out
}

// Ref is a unique subject_ref.
func Ref(i int) string { return fmt.Sprintf("event:e%04d", i) }
