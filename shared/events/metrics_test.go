package events

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/shared/clock"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// metricValue returns the value of the counter or gauge name whose labels
// include want, summed over the series that match; -1 when none matches.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total, found := 0.0, false
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue series
				}
			}
			found = true
			total += value(m)
		}
	}
	if !found {
		return -1
	}
	return total
}

func value(m *dto.Metric) float64 {
	switch {
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	default:
		return 0
	}
}

// The per-consumer metrics through a poison event: a handler failing with
// a foreign-key violation counts one handler failure per attempt, then one
// dead letter (handler_exhausted), never a duplicate; the ten events after
// it are processed within two catch-up intervals (the interval injected
// small, 500 ms) and the catch-up lag returns to 0.
func TestConsumerMetricsThroughAPoisonEvent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `CREATE TABLE accounts (code text PRIMARY KEY);
		INSERT INTO accounts VALUES ('1010');
		CREATE TABLE postings (event_id uuid PRIMARY KEY, account text NOT NULL REFERENCES accounts (code))`); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig()
	cfg.ConsumerIntervalMS = 500 // small, yet above a pass of 11 events under -race on a shared machine
	cfg.ConsumerMaxAttempts = 3
	run(t, e.dispatcher(cfg).Run)
	types := []string{"InvoicePaid.v1"}
	post := func(ctx context.Context, tx pgx.Tx, d Delivery) error {
		_, err := tx.Exec(ctx, `INSERT INTO postings (event_id, account) VALUES ($1, $2::jsonb->>'account')`, d.ID, string(d.Payload))
		return err
	}
	reg := prometheus.NewRegistry()
	c := e.client(cfg, WithRegistry(reg))
	if _, err := e.pool.Exec(ctx, sqlRegisterConsumer, "ledger", types); err != nil {
		t.Fatal(err)
	}
	pub := func(account string) string {
		t.Helper()
		var id string
		err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			var err error
			id, err = Publish(ctx, tx, Event{Type: "InvoicePaid.v1", AggregateID: "in_1", Payload: []byte(`{"account":"` + account + `"}`)})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	poison := pub("9999") // no such account: SQLSTATE 23503 in the handler
	for range 10 {
		pub("1010")
	}
	eventually(t, 10*time.Second, "all dispatched", func() bool {
		return e.count(`SELECT count(*) FROM event_outbox WHERE status = 'dispatched'`) == 11
	})

	// the catch-up loop alone delivers (no real-time racing it), so any
	// duplicate counted would be a misclassified error
	w := &worker{c: c, name: "ledger", types: types, h: post, log: e.log}
	stop := run(t, func(ctx context.Context) error { w.catchUpLoop(ctx); return nil })
	eventually(t, 2*cfg.consumerInterval(), "the 10 events after the poison processed within two catch-up intervals", func() bool {
		return e.count(`SELECT count(*) FROM event_inbox WHERE consumer = 'ledger' AND status = 'processed'`) == 10
	})
	eventually(t, 10*time.Second, "poison dead-lettered and lag back to 0", func() bool {
		return e.count(`SELECT count(*) FROM event_inbox WHERE event_id = $1 AND dead_lettered_at IS NOT NULL`, poison) == 1 &&
			metricValue(t, reg, "aurora_events_consumer_catch_up_lag_seconds", map[string]string{"consumer": "ledger"}) == 0
	})
	stop()

	ledger := map[string]string{"consumer": "ledger"}
	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"aurora_events_consumer_processed_total", map[string]string{"consumer": "ledger", "source": "catch_up"}, 10},
		{"aurora_events_consumer_failures_total", map[string]string{"consumer": "ledger", "stage": "handler"}, float64(cfg.ConsumerMaxAttempts)},
		{"aurora_events_consumer_dead_letters_total", map[string]string{"consumer": "ledger", "reason": string(ReasonHandlerExhausted)}, 1},
		{"aurora_events_consumer_catch_up_lag_seconds", ledger, 0},
	} {
		if got := metricValue(t, reg, tc.name, tc.labels); got != tc.want {
			t.Errorf("%s%v = %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}
	// never a duplicate, never a claim failure: the FK violation is the
	// handler's error, not the inbox key's
	for _, name := range []string{"aurora_events_consumer_duplicates_total"} {
		if got := metricValue(t, reg, name, ledger); got > 0 {
			t.Errorf("%s = %v, want 0", name, got)
		}
	}
	if got := metricValue(t, reg, "aurora_events_consumer_failures_total", map[string]string{"consumer": "ledger", "stage": "claim"}); got > 0 {
		t.Errorf("claim failures = %v, want 0", got)
	}
	var status string
	var dups int
	if err := e.pool.QueryRow(ctx, `SELECT status, duplicate_deliveries FROM event_inbox WHERE consumer = 'ledger' AND event_id = $1`, poison).
		Scan(&status, &dups); err != nil {
		t.Fatal(err)
	}
	if status != string(InboxFailed) || dups != 0 {
		t.Fatalf("poison inbox row %s with %d duplicate deliveries, want failed with 0", status, dups)
	}
	if n := e.count(`SELECT count(*) FROM postings`); n != 10 {
		t.Fatalf("%d postings, want 10", n)
	}
}

// A lagging consumer shows its lag: the age of the oldest dispatched event
// it owes, on the injected clock.
func TestCatchUpLagGauge(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	cfg := testConfig()
	if _, err := EnsureStream(ctx, e.js, cfg); err != nil {
		t.Fatal(err)
	}
	ids := e.publish("InvoicePaid.v1", 1)
	d := e.dispatcher(cfg)
	if _, err := d.DispatchOnce(ctx); err != nil {
		t.Fatal(err)
	}
	var dispatchedAt time.Time
	if err := e.pool.QueryRow(ctx, `SELECT dispatched_at FROM event_outbox WHERE event_id = $1`, ids[0]).Scan(&dispatchedAt); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	clk := clock.NewManual(dispatchedAt.Add(90 * time.Second))
	c := e.client(cfg, WithRegistry(reg), WithClock(clk))
	failing := func(context.Context, pgx.Tx, Delivery) error { return errors.New("downstream unavailable") }
	if _, err := c.CatchUpOnce(ctx, "slow", []string{"InvoicePaid.v1"}, failing); err != nil {
		t.Fatal(err)
	}
	if got := metricValue(t, reg, "aurora_events_consumer_catch_up_lag_seconds", map[string]string{"consumer": "slow"}); got < 89.9 || got > 90.1 {
		t.Fatalf("lag %v s, want 90", got)
	}
}
