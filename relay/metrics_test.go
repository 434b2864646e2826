package relay

import (
	"context"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/shared/clock"
	"github.com/aurora-billing/aurora/shared/natstest"
	"github.com/prometheus/client_golang/prometheus"
)

func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("%s not gathered", name)
	return 0
}

// The backlog gauge is the age, by the database clock (here a manual one),
// of the oldest row that is due and not yet published: a pending row by its
// next_attempt_at, a leased row by its lease's expiry. 0 with no backlog.
func TestOldestUnpublishedAgeGauge(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	_, js := connect(t, natstest.New(t))
	ctx := context.Background()
	now := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	clk := clock.NewManual(now)
	reg := prometheus.NewRegistry()
	// Not started: the relay only serves its metrics here.
	if _, err := New(pool, js, testConfig(), WithClock(clk), WithRegistry(reg), WithLogger(quietLogger())); err != nil {
		t.Fatal(err)
	}
	const name = "aurora_relay_oldest_unpublished_age_seconds"
	if v := gauge(t, reg, name); v != 0 {
		t.Fatalf("empty outbox: %v, want 0", v)
	}
	ids := stage(t, pool, items("org_age", 0, 3)...)
	for id, sql := range map[int64]string{
		ids[0]: `UPDATE outbox_items SET next_attempt_at = $2 WHERE id = $1`,                                                                        // due 90 s ago
		ids[1]: `UPDATE outbox_items SET state = 'leased', lease_token = 1, lease_expires_at = $2::timestamptz - interval '1 minute' WHERE id = $1`, // expired 150 s ago
		ids[2]: `UPDATE outbox_items SET next_attempt_at = $2::timestamptz + interval '10 minutes' WHERE id = $1`,                                   // not due
	} {
		at := now.Add(-90 * time.Second)
		if _, err := pool.Exec(ctx, sql, id, at); err != nil {
			t.Fatal(err)
		}
	}
	if v := gauge(t, reg, name); v != 150 {
		t.Fatalf("age %v, want 150 (the expired lease)", v)
	}
	if _, err := pool.Exec(ctx, `UPDATE outbox_items SET published_dispatch = dispatch WHERE id = $1`, ids[1]); err != nil {
		t.Fatal(err)
	}
	if v := gauge(t, reg, name); v != 90 {
		t.Fatalf("age %v, want 90", v)
	}
}

// A scrape whose query fails fails: no zero reported in place of a
// measurement.
func TestBacklogScrapeFailsWhenQueryFails(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	_, js := connect(t, natstest.New(t))
	reg := prometheus.NewRegistry()
	if _, err := New(pool, js, testConfig(), WithRegistry(reg), WithLogger(quietLogger())); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Gather(); err != nil {
		t.Fatalf("healthy scrape: %v", err)
	}
	pool.Close()
	if _, err := reg.Gather(); err == nil {
		t.Fatal("scrape succeeded with the database gone")
	}
}

func TestMetricsRegisterOnTheGivenRegistryOnly(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	_, js := connect(t, natstest.New(t))
	reg := prometheus.NewRegistry()
	if _, err := New(pool, js, testConfig(), WithRegistry(reg), WithLogger(quietLogger())); err != nil {
		t.Fatal(err)
	}
	if _, err := New(pool, js, testConfig(), WithRegistry(reg), WithLogger(quietLogger())); err == nil {
		t.Fatal("a second relay on the same registry registered its metrics twice")
	}
	if _, err := New(pool, js, testConfig(), WithRegistry(prometheus.NewRegistry()), WithLogger(quietLogger())); err != nil {
		t.Fatal(err)
	}
}
