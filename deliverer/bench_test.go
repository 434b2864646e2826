package deliverer_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
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

// queryCounter counts statements sent by the deliverer's pool: Postgres
// round trips (each statement is one round trip; none are pipelined).
type queryCounter struct{ n atomic.Int64 }

func (q *queryCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	q.n.Add(1)
	return ctx
}
func (q *queryCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// vmHWM is the process's peak resident set size in bytes (Linux).
func vmHWM() float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmHWM:") {
			f := strings.Fields(l)
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb * 1024
		}
	}
	return 0
}

// BenchmarkDeliver measures one deliverer (concurrency 128 or 256) draining b.N
// published items spread round-robin over 200 customers of one meter,
// against the emulator at 0 ms and 50 ms latency (live mode's one call per
// customer and meter enforced). Reports items/s, Postgres round trips per
// item, the peak of concurrent provider calls, and the process's peak RSS
// (which includes the embedded JetStream server and the emulator: an upper
// bound for the deliverer alone). Run with -benchtime=Nx (N items).
func BenchmarkDeliver(b *testing.B) {
	for _, c := range []struct {
		latency     time.Duration
		concurrency int
	}{{0, 128}, {50 * time.Millisecond, 128}, {50 * time.Millisecond, 256}} {
		b.Run(fmt.Sprintf("latency=%s/concurrency=%d", c.latency, c.concurrency), func(b *testing.B) { benchDeliver(b, c.latency, c.concurrency) })
	}
}

func benchDeliver(b *testing.B, latency time.Duration, concurrency int) {
	const customers = 200
	ctx := context.Background()
	url := dbtest.NewDatabase(b)
	seed, err := pgxpool.New(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	defer seed.Close()
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
		if _, err := seed.Exec(ctx, q, args...); err != nil {
			b.Fatal(err)
		}
	}
	mustExec(`INSERT INTO stripe_accounts (account_id, mode, confirmed) VALUES ($1, 'test', true)`, acct)
	mustExec(`INSERT INTO meter_mappings (destination_account, feature, meter_id, event_name) VALUES ($1, $2, $3, $2)`, acct, feature, meter.ID)
	for c := range customers {
		cus := fmt.Sprintf("cus_b%03d", c)
		if err := emu.AddCustomer(cus); err != nil {
			b.Fatal(err)
		}
		mustExec(`INSERT INTO tenant_billing (tenant, destination_account, stripe_customer) VALUES ($1, $2, $3)`, fmt.Sprintf("org_b%03d", c), acct, cus)
	}
	// Stage b.N items in transactions of 500.
	now := time.Now().UTC()
	rows := make([]outbox.Row, 0, b.N)
	for start := 0; start < b.N; start += 500 {
		err := pgx.BeginFunc(ctx, seed, func(tx pgx.Tx) error {
			for i := start; i < min(start+500, b.N); i++ {
				row, err := outbox.Stage(ctx, tx, outbox.Item{
					Identity: identity.Identity{Tenant: fmt.Sprintf("org_b%03d", i%customers), SubjectKind: identity.SubjectEvent,
						SubjectRef: fmt.Sprintf("event:%d", i), Exporter: outbox.DefaultExporter, DestinationAccount: acct,
						Mode: identity.ModeTest, MappingVersion: 1},
					Feature: feature, Quantity: 1, OccurredAt: now.Add(-time.Minute),
				})
				if err != nil {
					return err
				}
				rows = append(rows, row)
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	srv := natstest.New(b)
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		b.Fatal(err)
	}
	if _, err := relay.EnsureStream(ctx, js, relay.DefaultStreamConfig()); err != nil {
		b.Fatal(err)
	}
	for _, row := range rows {
		msg := outbox.Message{ItemID: row.ID, Key: row.IdempotencyKey, Dispatch: row.Dispatch}
		if _, err := js.PublishAsync(outbox.PartitionSubject(row.Exporter, row.Tenant, 0), msg.Encode(), jetstream.WithMsgID(outbox.MsgID(row.IdempotencyKey, row.Dispatch))); err != nil {
			b.Fatal(err)
		}
	}
	<-js.PublishAsyncComplete()

	// The deliverer's own pool, with a statement counter.
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		b.Fatal(err)
	}
	pcfg.MaxConns = 16
	qc := &queryCounter{}
	pcfg.ConnConfig.Tracer = qc
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	cfg := deliverer.DefaultConfig()
	cfg.Concurrency = concurrency
	cfg.BusyDelayMillis = 50
	exp, err := stripeexport.New(stripeexport.Config{APIKey: testKey, APIBase: hs.URL}, 10*time.Second, cfg.Concurrency)
	if err != nil {
		b.Fatal(err)
	}
	d, err := deliverer.New(pool, js, exp, cfg, deliverer.WithLogger(quietLogger()))
	if err != nil {
		b.Fatal(err)
	}
	var peak atomic.Int64
	sampleDone := make(chan struct{})
	go func() {
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-sampleDone:
				return
			case <-t.C:
				if n := int64(emu.Stats().InFlight); n > peak.Load() {
					peak.Store(n)
				}
			}
		}
	}()
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	b.ResetTimer()
	start := time.Now()
	go func() { done <- d.Run(runCtx) }()
	for len(emu.Applied()) < b.N {
		time.Sleep(2 * time.Millisecond)
	}
	// Applied is provider-side; wait for the outcomes too.
	for {
		var n int
		if err := seed.QueryRow(ctx, `SELECT count(*) FROM outbox_items WHERE state = 'accepted'`).Scan(&n); err != nil {
			b.Fatal(err)
		}
		if n == b.N {
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	cancel()
	<-done
	close(sampleDone)
	if emu.Overlaps() != 0 || len(emu.DuplicateApplications()) != 0 {
		b.Fatalf("overlaps %d duplicates %d", emu.Overlaps(), len(emu.DuplicateApplications()))
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "items/s")
	b.ReportMetric(float64(qc.n.Load())/float64(b.N), "pg_roundtrips/item")
	b.ReportMetric(float64(peak.Load()), "peak_inflight")
	b.ReportMetric(vmHWM()/(1<<20), "peak_rss_MiB")
}
