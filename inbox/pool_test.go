package inbox

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stripe/stripe-go/v76/webhook"
)

// poolOfOne opens a pool on a fresh database the way an operator's
// AURORA_DATABASE_URL=…?pool_max_conns=1 does, and a separate observer pool
// for the test's own reads.
func poolOfOne(t *testing.T) (pool, observer *pgxpool.Pool) {
	t.Helper()
	raw := dbtest.NewDatabase(t)
	observer, err := pgxpool.New(context.Background(), raw)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(observer.Close)
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("pool_max_conns", "1")
	u.RawQuery = q.Encode()
	pool, err = pgxpool.New(context.Background(), u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if pool.Config().MaxConns != 1 {
		t.Fatalf("MaxConns %d", pool.Config().MaxConns)
	}
	return pool, observer
}

// With one pooled connection a failing projection is counted with its
// backoff, other events are projected, and the webhook and /readyz keep
// answering: the service's whole wiring (one pool, one listener, the worker
// on the database clock), not a manual clock.
func TestPoolOfOneConnectionSurvivesAFailingProjection(t *testing.T) {
	t.Parallel()
	pool, observer := poolOfOne(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	store := NewStore(pool, nil)
	defer store.Close()
	reg := newTestRegistry()
	metrics := NewMetrics(reg, pool)
	srv := httptest.NewServer(NewMux(pool, NewHandler(store, []string{testSecret}, metrics, nil), reg))
	defer srv.Close()
	w := NewWorker(pool, WorkerConfig{BatchSize: BatchSizeDefault, Poll: time.Second, Metrics: metrics})
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()

	exec := func(sql string) {
		t.Helper()
		if _, err := observer.Exec(context.Background(), sql); err != nil {
			t.Fatal(err)
		}
	}
	client := &http.Client{Timeout: 5 * time.Second}
	send := func(body []byte) time.Duration {
		t.Helper()
		start := time.Now()
		sp := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: body, Secret: testSecret, Timestamp: time.Now()})
		req, _ := http.NewRequest(http.MethodPost, srv.URL+WebhookPath, bytes.NewReader(body))
		req.Header.Set("Stripe-Signature", sp.Header)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("webhook answered %d", resp.StatusCode)
		}
		return time.Since(start)
	}
	exec(`INSERT INTO stripe_price_plans (price_id, plan) VALUES ('price_a', 'basic')`)
	exec(`CREATE FUNCTION refuse_bad() RETURNS trigger LANGUAGE plpgsql AS $$
	      BEGIN IF NEW.customer_id = 'cus_bad' THEN RAISE EXCEPTION 'refused'; END IF; RETURN NEW; END $$`)
	exec(`CREATE TRIGGER refuse_bad BEFORE INSERT OR UPDATE ON stripe_subscriptions FOR EACH ROW EXECUTE FUNCTION refuse_bad()`)

	send(checkout(t, "evt_co_bad", t0, "cus_bad", "tenant_bad", "sub_bad"))
	send(checkout(t, "evt_co_ok", t0, "cus_ok", "tenant_ok", "sub_ok"))
	start := time.Now()
	send(subscription(t, "customer.subscription.created", "evt_bad", t0+1, "cus_bad", "sub_bad", "active", "price_a"))
	send(subscription(t, "customer.subscription.created", "evt_ok", t0+1, "cus_ok", "sub_ok", "active", "price_a"))

	deadline := start.Add(5 * time.Second)
	var (
		attempts  int
		reason    *string
		backoff   float64
		okApplied bool
	)
	for {
		err := observer.QueryRow(context.Background(), `
SELECT b.attempts, b.last_reason, extract(epoch FROM b.next_attempt_at - now())::float8,
       (SELECT processed_at IS NOT NULL FROM billing_events WHERE event_id = 'evt_ok')
  FROM billing_events b WHERE b.event_id = 'evt_bad'`).Scan(&attempts, &reason, &backoff, &okApplied)
		if err != nil {
			t.Fatal(err)
		}
		if attempts == 1 && okApplied {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 5 s: evt_bad attempts %d reason %v, evt_ok processed %v", attempts, deref(reason), okApplied)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("failure recorded and the other event applied %s after delivery", time.Since(start).Round(time.Millisecond))
	if deref(reason) != string(ReasonProjectionFailed) || backoff < float64(BackoffBase)-5 || backoff > float64(BackoffBase) {
		t.Fatalf("evt_bad: reason %v, due in %.1f s; want projection_failed due in ~%d s", deref(reason), backoff, BackoffBase)
	}
	if en := entitlementOf(t, observer, "tenant_ok"); en.plan != "basic" {
		t.Fatalf("tenant_ok: %+v", en)
	}
	// the webhook and /readyz keep answering while the worker polls
	for i := 0; i < 5; i++ {
		if d := send(encode(t, envelope(t, "evt_later_"+string(rune('a'+i)), "charge.succeeded", "2020-08-27", t0, map[string]any{"id": "ch_1"}))); d > 2*time.Second {
			t.Fatalf("webhook took %s", d)
		}
	}
	resp, err := client.Get(srv.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/readyz %d", resp.StatusCode)
	}
}

// entitlementOf reads a tenant's entitlement from pool.
func entitlementOf(t *testing.T, pool *pgxpool.Pool, tenant string) entitlement {
	t.Helper()
	e := &env{t: t, pool: pool}
	return e.entitlement(tenant)
}
