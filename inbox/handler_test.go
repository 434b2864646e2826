package inbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stripe/stripe-go/v76/webhook"
)

func TestWebhookStoresRawBodyVerbatimAndRedeliveryIsIdempotent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	raw, err := os.ReadFile("testdata/ruby-mock.invoice.paid.json") // indented, as Stripe's fixture has it
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if rec := post(t, e.handler, raw, testSecret, time.Now()); rec.Code != http.StatusOK {
			t.Fatalf("delivery %d: %d %s", i, rec.Code, rec.Body)
		}
	}
	var stored []byte
	var typ, api string
	var created time.Time
	var customer string
	if err := e.pool.QueryRow(context.Background(), `SELECT payload, event_type, api_version, event_created, customer_id FROM billing_events`).
		Scan(&stored, &typ, &api, &created, &customer); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(stored, raw) {
		t.Fatal("stored payload differs from the raw body")
	}
	if typ != "invoice.paid" || api != "2020-08-27" || created.IsZero() || customer != "cus_00000000000000" {
		t.Fatalf("envelope columns: %s %s %v %s", typ, api, created, customer)
	}
	if n := e.count(`SELECT count(*) FROM billing_events`); n != 1 {
		t.Fatalf("rows: %d, want 1", n)
	}

	// the templated fixtures share one event id: a different body under a
	// stored id is answered 2xx (Stripe must stop retrying) but kept apart,
	// never applied and never overwriting the first
	other, _ := os.ReadFile("testdata/ruby-mock.invoice.payment_failed.json")
	if rec := post(t, e.handler, other, testSecret, time.Now()); rec.Code != http.StatusOK {
		t.Fatalf("conflicting redelivery: %d", rec.Code)
	}
	if n := e.count(`SELECT count(*) FROM billing_event_id_conflicts`); n != 1 {
		t.Fatalf("conflicts kept: %d, want 1", n)
	}
	if n := e.count(`SELECT count(*) FROM billing_events WHERE payload = $1`, raw); n != 1 {
		t.Fatal("the first body was overwritten")
	}
}

func TestWebhookRejectsWithoutStoring(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	body := subscription(t, "customer.subscription.created", "evt_reject", 1700000000, "cus_r", "sub_r", "active", "price_r")
	reserialised := func() []byte {
		var v any
		_ = json.Unmarshal(body, &v)
		b, _ := json.MarshalIndent(v, "", "  ")
		return b
	}()
	tests := []struct {
		name   string
		send   []byte
		header func() string
	}{
		{"bad signature", body, func() string {
			return webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: body, Secret: "whsec_wrong"}).Header
		}},
		{"stale timestamp", body, func() string {
			return webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: body, Secret: testSecret, Timestamp: time.Now().Add(-SignatureTolerance - 5*time.Second)}).Header
		}},
		{"future timestamp", body, func() string {
			return webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: body, Secret: testSecret, Timestamp: time.Now().Add(FutureTolerance + 5*time.Second)}).Header
		}},
		{"re-serialised body", reserialised, func() string {
			return webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: body, Secret: testSecret}).Header
		}},
		{"no signature header", body, func() string { return "" }},
		{"malformed header", body, func() string { return "t=abc,v1=zz" }},
		{"v0 scheme only", body, func() string {
			return webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: body, Secret: testSecret, Scheme: "v0"}).Header
		}},
	}
	for _, tc := range tests {
		req := httptest.NewRequest(http.MethodPost, WebhookPath, bytes.NewReader(tc.send))
		if h := tc.header(); h != "" {
			req.Header.Set("Stripe-Signature", h)
		}
		rec := httptest.NewRecorder()
		e.handler.ServeHTTP(rec, req)
		if rec.Code != http.StatusBadRequest {
			t.Errorf("%s: status %d, want 400", tc.name, rec.Code)
		}
	}
	if n := e.count(`SELECT count(*) FROM billing_events`); n != 0 {
		t.Fatalf("rows stored after rejected requests: %d", n)
	}
	// the future rule is deliberate: inside the tolerance is accepted
	if rec := post(t, e.handler, body, testSecret, time.Now().Add(FutureTolerance-30*time.Second)); rec.Code != http.StatusOK {
		t.Fatalf("timestamp 270 s ahead: %d, want 200", rec.Code)
	}
}

func TestWebhookSecretRotation(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	h := NewHandler(NewStore(pool, nil), []string{"whsec_old", "whsec_new"}, nil, nil)
	for i, secret := range []string{"whsec_old", "whsec_new"} {
		body := subscription(t, "customer.subscription.created", fmt.Sprintf("evt_rot_%d", i), 1700000000, "cus_rot", "sub_rot", "active", "price_r")
		if rec := post(t, h, body, secret, time.Now()); rec.Code != http.StatusOK {
			t.Fatalf("signed with %s: %d", secret, rec.Code)
		}
	}
	// Stripe sends two v1 signatures while it rolls a secret; one valid is enough
	body := subscription(t, "customer.subscription.created", "evt_rot_2", 1700000000, "cus_rot", "sub_rot", "active", "price_r")
	now := time.Now()
	header := fmt.Sprintf("t=%d,v1=%x,v1=%x", now.Unix(), webhook.ComputeSignature(now, body, "whsec_unknown"), webhook.ComputeSignature(now, body, "whsec_new"))
	req := httptest.NewRequest(http.MethodPost, WebhookPath, bytes.NewReader(body))
	req.Header.Set("Stripe-Signature", header)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Fatalf("two v1 signatures: %d", rec.Code)
	}
	var n int
	_ = pool.QueryRow(context.Background(), `SELECT count(*) FROM billing_events`).Scan(&n)
	if n != 3 {
		t.Fatalf("rows %d, want 3", n)
	}
}

func TestWebhookBodyLimit(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pad := func(size int) []byte {
		m := envelope(t, fmt.Sprintf("evt_pad_%d", size), "customer.updated", "2023-10-16", 1700000000, map[string]any{"id": "cus_pad", "object": "customer"})
		base := len(encode(t, m))
		m["padding"] = strings.Repeat("x", size-base-len(`,"padding":""`))
		b := encode(t, m)
		if len(b) != size {
			t.Fatalf("padded to %d, want %d", len(b), size)
		}
		return b
	}
	if rec := post(t, e.handler, pad(MaxBodyBytes), testSecret, time.Now()); rec.Code != http.StatusOK {
		t.Fatalf("exactly 512 KiB: %d", rec.Code)
	}
	if rec := post(t, e.handler, pad(MaxBodyBytes+1), testSecret, time.Now()); rec.Code != http.StatusRequestEntityTooLarge {
		t.Fatalf("512 KiB + 1: %d, want 413", rec.Code)
	}
	if n := e.count(`SELECT count(*) FROM billing_events`); n != 1 {
		t.Fatalf("rows %d, want 1", n)
	}
}

func TestWebhookStoresEveryAPIVersion(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for i, v := range []string{"", "2017-12-14", "2020-08-27", "2023-10-16", "2025-03-31.basil", "2026-08-26.clover"} {
		body := encode(t, envelope(t, fmt.Sprintf("evt_api_%d", i), "customer.updated", v, 1700000000, map[string]any{"id": "cus_v"}))
		e.deliver(body)
	}
	if n := e.count(`SELECT count(*) FROM billing_events`); n != 6 {
		t.Fatalf("rows %d, want 6", n)
	}
}

// Never a 2xx without a committed row: with the database gone the endpoint
// answers 5xx.
func TestWebhookDatabaseDownIs5xx(t *testing.T) {
	t.Parallel()
	body := subscription(t, "customer.subscription.created", "evt_down", 1700000000, "cus_d", "sub_d", "active", "price_d")

	t.Run("database dropped under a live pool", func(t *testing.T) {
		t.Parallel()
		url := dbtest.NewDatabase(t)
		pool, err := pgxpool.New(context.Background(), url)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		h := NewHandler(NewStore(pool, nil), []string{testSecret}, nil, nil)
		if rec := post(t, h, subscription(t, "customer.subscription.created", "evt_up", 1700000000, "cus_d", "sub_d", "active", "price_d"), testSecret, time.Now()); rec.Code != http.StatusOK {
			t.Fatalf("before: %d", rec.Code)
		}
		admin, err := pgx.Connect(context.Background(), dbtest.AdminURL())
		if err != nil {
			t.Fatal(err)
		}
		defer admin.Close(context.Background())
		name := url[strings.LastIndex(url, "/")+1:]
		if _, err := admin.Exec(context.Background(), "DROP DATABASE "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 3; i++ {
			if rec := post(t, h, body, testSecret, time.Now()); rec.Code < 500 {
				t.Fatalf("attempt %d with the database gone: %d, want 5xx", i, rec.Code)
			}
		}
	})
	t.Run("closed pool", func(t *testing.T) {
		t.Parallel()
		pool := dbtest.New(t)
		h := NewHandler(NewStore(pool, nil), []string{testSecret}, nil, nil)
		pool.Close()
		if rec := post(t, h, body, testSecret, time.Now()); rec.Code != http.StatusServiceUnavailable {
			t.Fatalf("closed pool: %d, want 503", rec.Code)
		}
	})
	t.Run("insert fails", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		e.exec(`CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'refused'; END $$`)
		e.exec(`CREATE TRIGGER refuse BEFORE INSERT ON billing_events FOR EACH ROW EXECUTE FUNCTION refuse()`)
		if rec := post(t, e.handler, body, testSecret, time.Now()); rec.Code != http.StatusServiceUnavailable {
			t.Fatalf("failed insert: %d, want 503", rec.Code)
		}
		if strings.Contains(e.logs.String(), "cus_d") {
			t.Fatal("a customer id reached the log")
		}
	})
}

func TestWebhookOverLoopbackWithOpsEndpoints(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	reg := newTestRegistry()
	metrics := NewMetrics(reg, e.pool)
	h := NewHandler(NewStore(e.pool, nil), []string{testSecret}, metrics, nil)
	srv := httptest.NewServer(NewMux(e.pool, h, reg))
	defer srv.Close()
	body := subscription(t, "customer.subscription.created", "evt_loop", 1700000000, "cus_l", "sub_l", "active", "price_l")
	sp := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: body, Secret: testSecret})
	req, _ := http.NewRequest(http.MethodPost, srv.URL+WebhookPath, bytes.NewReader(body))
	req.Header.Set("Stripe-Signature", sp.Header)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		_, _ = buf.ReadFrom(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d", path, resp.StatusCode)
		}
		if path == "/metrics" && !contains(buf.String(), `aurora_inbox_webhooks_total{result="stored"} 1`, "aurora_inbox_pending 1",
			`aurora_inbox_dead_letters{reason="customer_not_linked"} 0`, "aurora_inbox_oldest_pending_age_seconds") {
			t.Fatalf("metrics:\n%s", buf.String())
		}
	}
	if resp, _ := http.Get(srv.URL + WebhookPath); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("GET webhook: %d", resp.StatusCode)
	}
}

func TestSignatureErrorsAreSentinels(t *testing.T) {
	t.Parallel()
	h := NewHandler(nil, []string{testSecret}, nil, nil)
	body := []byte(`{"id":"evt_1","object":"event","type":"x","created":1}`)
	future := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: body, Secret: testSecret, Timestamp: time.Now().Add(time.Hour)})
	if _, err := h.verify(body, future.Header); !errors.Is(err, ErrFutureTimestamp) {
		t.Fatalf("future: %v", err)
	}
	stale := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: body, Secret: testSecret, Timestamp: time.Now().Add(-time.Hour)})
	if _, err := h.verify(body, stale.Header); !errors.Is(err, webhook.ErrTooOld) {
		t.Fatalf("stale: %v", err)
	}
	noID := []byte(`{"object":"event","type":"x","created":1}`)
	if _, err := h.verify(noID, webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: noID, Secret: testSecret}).Header); !errors.Is(err, ErrNoEventID) {
		t.Fatalf("no id: %v", err)
	}
}
