package inbox

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/shared/clock"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stripe/stripe-go/v76/webhook"
)

const testSecret = "whsec_test_inbox_current"

// env is one test's inbox: a fresh database, a manual clock for the worker,
// the webhook handler and a worker.
type env struct {
	t       *testing.T
	pool    *pgxpool.Pool
	clk     *clock.Manual
	handler *Handler
	worker  *Worker
	logs    *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newEnv(t *testing.T) *env {
	t.Helper()
	pool := dbtest.New(t)
	clk := clock.NewManual(time.Now().Truncate(time.Second))
	logs := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	e := &env{t: t, pool: pool, clk: clk, logs: logs}
	store := NewStore(pool, clk)
	t.Cleanup(store.Close)
	e.handler = NewHandler(store, []string{testSecret}, nil, log)
	e.worker = NewWorker(pool, WorkerConfig{BatchSize: BatchSizeMax, Clock: clk, Log: log})
	return e
}

// post signs body with secret at ts and posts it to the handler.
func post(t *testing.T, h http.Handler, body []byte, secret string, ts time.Time) *httptest.ResponseRecorder {
	t.Helper()
	sp := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: body, Secret: secret, Timestamp: ts})
	req := httptest.NewRequest(http.MethodPost, WebhookPath, bytes.NewReader(body))
	req.Header.Set("Stripe-Signature", sp.Header)
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// deliver posts a correctly signed body and requires 200.
func (e *env) deliver(body []byte) {
	e.t.Helper()
	rec := post(e.t, e.handler, body, testSecret, time.Now())
	if rec.Code != http.StatusOK {
		e.t.Fatalf("deliver: status %d body %q", rec.Code, rec.Body.String())
	}
}

func (e *env) pass() Pass {
	e.t.Helper()
	p, err := e.worker.RunPass(context.Background())
	if err != nil {
		e.t.Fatalf("pass: %v", err)
	}
	return p
}

// drain runs passes until one handles nothing (without moving the clock).
func (e *env) drain() {
	e.t.Helper()
	for i := 0; i < 20; i++ {
		if p := e.pass(); p.Claimed == 0 {
			return
		}
	}
	e.t.Fatal("drain: still claiming after 20 passes")
}

type row struct {
	attempts      int
	lastReason    string
	outcome       string
	processed     bool
	deadLetter    bool
	nextAttemptAt time.Time
}

func (e *env) row(id string) row {
	e.t.Helper()
	var r row
	var reason, outcome *string
	err := e.pool.QueryRow(context.Background(), `
SELECT attempts, last_reason, outcome, processed_at IS NOT NULL, dead_letter_at IS NOT NULL, next_attempt_at
  FROM billing_events WHERE event_id = $1`, id).Scan(&r.attempts, &reason, &outcome, &r.processed, &r.deadLetter, &r.nextAttemptAt)
	if err != nil {
		e.t.Fatalf("row %s: %v", id, err)
	}
	r.lastReason, r.outcome = deref(reason), deref(outcome)
	return r
}

func (e *env) exec(sql string, args ...any) {
	e.t.Helper()
	if _, err := e.pool.Exec(context.Background(), sql, args...); err != nil {
		e.t.Fatalf("exec %q: %v", sql, err)
	}
}

func (e *env) count(sql string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		e.t.Fatalf("count %q: %v", sql, err)
	}
	return n
}

func (e *env) mapPrice(price, plan string) {
	e.exec(`INSERT INTO stripe_price_plans (price_id, plan) VALUES ($1, $2)`, price, plan)
}

type entitlement struct {
	subscriptionID, subscriptionStatus, plan, billingStatus string
}

func (e *env) entitlement(tenant string) entitlement {
	e.t.Helper()
	var en entitlement
	var sub, st, plan *string
	err := e.pool.QueryRow(context.Background(), `
SELECT subscription_id, subscription_status, plan, billing_status FROM tenant_entitlements WHERE tenant = $1`, tenant).
		Scan(&sub, &st, &plan, &en.billingStatus)
	if err != nil {
		e.t.Fatalf("entitlement %s: %v", tenant, err)
	}
	en.subscriptionID, en.subscriptionStatus, en.plan = deref(sub), deref(st), deref(plan)
	return en
}

// ---- payloads shaped like the shared data (testdata/SOURCES.md) ----

func fixture(t *testing.T, name string) map[string]any {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatalf("fixture: %v", err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("fixture %s: %v", name, err)
	}
	return m
}

func encode(t *testing.T, m map[string]any) []byte {
	t.Helper()
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// envelope wraps a data object (pay-rails shape) in a ruby-mock envelope.
func envelope(t *testing.T, id, typ, apiVersion string, created int64, object map[string]any) map[string]any {
	env := fixture(t, "ruby-mock.checkout.session.completed.json")
	env["id"], env["type"], env["created"] = id, typ, created
	if apiVersion == "" {
		delete(env, "api_version")
	} else {
		env["api_version"] = apiVersion
	}
	env["data"] = map[string]any{"object": object}
	return env
}

// checkout is a subscription-mode checkout.session.completed (pay-rails
// object) naming tenant by client_reference_id.
func checkout(t *testing.T, id string, created int64, customer, tenant, sub string) []byte {
	obj := fixture(t, "pay-rails.checkout.session.completed.object.json")["object"].(map[string]any)
	obj["customer"], obj["client_reference_id"], obj["subscription"] = customer, tenant, sub
	return encode(t, envelope(t, id, "checkout.session.completed", "2025-03-31.basil", created, obj))
}

// subscription is a customer.subscription.* event (ruby-mock envelope).
func subscription(t *testing.T, typ, id string, created int64, customer, sub, status, price string) []byte {
	name := "ruby-mock." + typ + ".json"
	if typ != "customer.subscription.created" && typ != "customer.subscription.deleted" {
		name = "ruby-mock.customer.subscription.updated.json"
	}
	env := fixture(t, name)
	env["id"], env["type"], env["created"] = id, typ, created
	obj := env["data"].(map[string]any)["object"].(map[string]any)
	obj["id"], obj["customer"], obj["status"] = sub, customer, status
	for _, it := range obj["items"].(map[string]any)["data"].([]any) {
		item := it.(map[string]any)
		item["price"].(map[string]any)["id"] = price
		if plan, ok := item["plan"].(map[string]any); ok {
			plan["id"] = price
		}
		item["subscription"] = sub
	}
	return encode(t, env)
}

type invoiceLayout int

const (
	legacyInvoice invoiceLayout = iota // invoice.subscription (≤ 2025-02-24)
	basilInvoice                       // invoice.parent.subscription_details.subscription (≥ 2025-03-31)
)

// invoice is an invoice.paid / invoice.payment_failed event in either layout.
func invoice(t *testing.T, layout invoiceLayout, typ, id string, created int64, customer, inv, sub string) []byte {
	switch layout {
	case legacyInvoice:
		name := "ruby-mock.invoice.paid.json"
		if typ == "invoice.payment_failed" {
			name = "ruby-mock.invoice.payment_failed.json"
		}
		env := fixture(t, name)
		env["id"], env["type"], env["created"] = id, typ, created
		obj := env["data"].(map[string]any)["object"].(map[string]any)
		obj["id"], obj["customer"], obj["subscription"] = inv, customer, sub
		return encode(t, env)
	default:
		obj := fixture(t, "pay-rails.invoice.payment_failed.object.json")["object"].(map[string]any)
		obj["id"], obj["customer"] = inv, customer
		obj["parent"].(map[string]any)["subscription_details"].(map[string]any)["subscription"] = sub
		return encode(t, envelope(t, id, typ, "2025-03-31.basil", created, obj))
	}
}

func contains(s string, subs ...string) bool {
	for _, x := range subs {
		if !strings.Contains(s, x) {
			return false
		}
	}
	return true
}

func newTestRegistry() *prometheus.Registry { return prometheus.NewRegistry() }
