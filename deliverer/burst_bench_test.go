package deliverer_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/deliverer"
	"github.com/aurora-billing/aurora/deliverer/stripeexport"
	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/relay"
	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/natstest"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/aurora-billing/aurora/stripeemulator"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// envInt reads a positive integer knob of a benchmark, or def.
func envInt(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		b.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// BenchmarkBurst is the no-starvation benchmark: while 50 cold tenants
// each commit one event a second, one hot tenant commits 20,000 events in
// one transaction; it reports the cold tenants' commit → accepted latency
// (p50, p99, max, in seconds) for the events they committed from the
// burst's start on, which must stay under 5 s at p99 (the hot lane holds
// at most its share of a partition's ack-pending window and defers the
// rest). Everything is real and in one process: Postgres, an embedded
// JetStream, a relay, two deliverers with the default configuration and
// the emulator (live mode's one call per customer and meter enforced).
// Latency is measured in Postgres: the item's created_at (its
// transaction's start) to the finished_at of its accepted attempt.
//
// Knobs (environment): BURST_EVENTS (20000), BURST_COLD_TENANTS (50),
// BURST_SECONDS of cold traffic after the burst (60), BURST_LATENCY_MS of
// the emulator (20). It runs once whatever b.N:
//
//	go test -run '^$' -bench BenchmarkBurst -benchtime 1x -timeout 30m ./deliverer/
func BenchmarkBurst(b *testing.B) {
	burst := envInt(b, "BURST_EVENTS", 20000)
	coldN := envInt(b, "BURST_COLD_TENANTS", 50)
	seconds := envInt(b, "BURST_SECONDS", 60)
	latency := time.Duration(envInt(b, "BURST_LATENCY_MS", 20)) * time.Millisecond
	const hot = "org_hot"
	ctx := context.Background()
	url := dbtest.NewDatabase(b)
	scfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		b.Fatal(err)
	}
	scfg.MaxConns = int32(coldN + 4) // the tenants' own connections: a commit never waits for the services'
	stage, err := pgxpool.NewWithConfig(ctx, scfg)
	if err != nil {
		b.Fatal(err)
	}
	defer stage.Close()
	emu, err := stripeemulator.New(stripeemulator.Config{Faults: stripeemulator.Faults{Latency: latency}, RequestLogLimit: 1})
	if err != nil {
		b.Fatal(err)
	}
	meter, err := emu.AddMeter(stripeemulator.MeterSpec{DisplayName: "API calls", EventName: feature})
	if err != nil {
		b.Fatal(err)
	}
	hs := httptest.NewServer(emu)
	defer hs.Close()
	mustExec := func(q string, args ...any) {
		if _, err := stage.Exec(ctx, q, args...); err != nil {
			b.Fatal(err)
		}
	}
	mustExec(`INSERT INTO stripe_accounts (account_id, mode, confirmed) VALUES ($1, 'test', true)`, acct)
	mustExec(`INSERT INTO meter_mappings (destination_account, feature, meter_id, event_name) VALUES ($1, $2, $3, $2)`, acct, feature, meter.ID)
	tenants := []string{hot}
	for i := range coldN {
		tenants = append(tenants, fmt.Sprintf("org_cold%02d", i))
	}
	for i, tenant := range tenants {
		cus := fmt.Sprintf("cus_burst%02d", i)
		if err := emu.AddCustomer(cus); err != nil {
			b.Fatal(err)
		}
		mustExec(`INSERT INTO tenant_billing (tenant, destination_account, stripe_customer) VALUES ($1, $2, $3)`, tenant, acct, cus)
	}
	item := func(tenant, ref string) outbox.Item {
		return outbox.Item{
			Identity: identity.Identity{Tenant: tenant, SubjectKind: identity.SubjectEvent, SubjectRef: ref,
				Exporter: outbox.DefaultExporter, DestinationAccount: acct, Mode: identity.ModeTest, MappingVersion: 1},
			Feature: feature, Quantity: 1, OccurredAt: time.Now().UTC().Add(-time.Minute),
		}
	}

	srv := natstest.New(b)
	nc, err := nats.Connect(srv.URL(), nats.MaxReconnects(-1))
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		b.Fatal(err)
	}
	pcfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	runCtx, cancel := context.WithCancel(ctx)
	var services sync.WaitGroup
	defer func() { cancel(); services.Wait() }()
	rl, err := relay.New(pool, js, relay.DefaultConfig(), relay.WithLogger(quietLogger()))
	if err != nil {
		b.Fatal(err)
	}
	services.Add(1)
	go func() { defer services.Done(); _ = rl.Run(runCtx) }()
	var ds []*deliverer.Deliverer
	for range 2 {
		cfg := deliverer.DefaultConfig()
		exp, err := stripeexport.New(stripeexport.Config{APIKey: testKey, APIBase: hs.URL}, 10*time.Second, cfg.Concurrency)
		if err != nil {
			b.Fatal(err)
		}
		d, err := deliverer.New(pool, js, exp, cfg, deliverer.WithLogger(quietLogger()))
		if err != nil {
			b.Fatal(err)
		}
		ds = append(ds, d)
		services.Add(1)
		go func() { defer services.Done(); _ = d.Run(runCtx) }()
	}
	for start := time.Now(); ; time.Sleep(50 * time.Millisecond) {
		ready := true
		for _, d := range ds {
			ready = ready && d.Ready() == nil
		}
		if ready {
			break
		}
		if time.Since(start) > time.Minute {
			b.Fatal("deliverers not ready after a minute")
		}
	}

	// Cold tenants: one event a second each, spread over the second.
	stopCold := make(chan struct{})
	var cold sync.WaitGroup
	errs := make(chan error, coldN)
	for i, tenant := range tenants[1:] {
		cold.Add(1)
		go func() {
			defer cold.Done()
			time.Sleep(time.Duration(i) * time.Second / time.Duration(coldN))
			t := time.NewTicker(time.Second)
			defer t.Stop()
			for n := 0; ; n++ {
				if err := pgx.BeginFunc(ctx, stage, func(tx pgx.Tx) error {
					_, err := outbox.Stage(ctx, tx, item(tenant, fmt.Sprintf("event:cold%d", n)))
					return err
				}); err != nil {
					errs <- err
					return
				}
				select {
				case <-stopCold:
					return
				case <-t.C:
				}
			}
		}()
	}
	time.Sleep(5 * time.Second) // the cold tenants' steady state first

	b.ResetTimer()
	var burstStart time.Time
	if err := stage.QueryRow(ctx, `SELECT now()`).Scan(&burstStart); err != nil {
		b.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, stage, func(tx pgx.Tx) error {
		for i := range burst {
			if _, err := outbox.Stage(ctx, tx, item(hot, fmt.Sprintf("event:hot%d", i))); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	burstCommitted := time.Since(burstStart)
	time.Sleep(time.Duration(seconds) * time.Second)
	close(stopCold)
	cold.Wait()
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
	// Every cold event accepted (they are the measurement), within a minute.
	for start := time.Now(); ; time.Sleep(100 * time.Millisecond) {
		var left int
		if err := stage.QueryRow(ctx, `SELECT count(*) FROM outbox_items WHERE tenant <> $1 AND state <> 'accepted'`, hot).Scan(&left); err != nil {
			b.Fatal(err)
		}
		if left == 0 {
			break
		}
		if time.Since(start) > time.Minute {
			b.Fatalf("%d cold events not accepted a minute after the cold traffic stopped", left)
		}
	}
	b.StopTimer()
	var n, hotAccepted int
	var p50, p99, worst float64
	err = stage.QueryRow(ctx, `
		SELECT count(*),
		       coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY s), 0),
		       coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY s), 0),
		       coalesce(max(s), 0),
		       (SELECT count(*) FROM outbox_items WHERE tenant = $1 AND state = 'accepted')
		FROM (SELECT extract(epoch FROM a.finished_at - i.created_at)::float8 AS s
		      FROM outbox_items i JOIN outbox_attempts a ON a.item_id = i.id AND a.outcome = 'accepted'
		      WHERE i.tenant <> $1 AND i.created_at >= $2) cold`, hot, burstStart).Scan(&n, &p50, &p99, &worst, &hotAccepted)
	if err != nil {
		b.Fatal(err)
	}
	if o, dup := emu.Overlaps(), len(emu.DuplicateApplications()); o != 0 || dup != 0 {
		b.Fatalf("overlapping calls %d, duplicate applications %d", o, dup)
	}
	b.ReportMetric(float64(n), "cold_events")
	b.ReportMetric(p50, "cold_p50_s")
	b.ReportMetric(p99, "cold_p99_s")
	b.ReportMetric(worst, "cold_max_s")
	b.ReportMetric(burstCommitted.Seconds(), "burst_commit_s")
	b.ReportMetric(float64(hotAccepted), "hot_accepted")
	if p99 >= 5 {
		b.Errorf("cold tenants' commit → accepted p99 %.2f s, want < 5 s", p99)
	}
}
