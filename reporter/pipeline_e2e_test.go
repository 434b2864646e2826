package reporter_test

// The same cutover, delivered by the real pipeline: the relay publishes
// committed rows to an embedded JetStream and the deliverer claims them,
// runs the pre-send checks (period_buffered among them) and sends them with
// stripe-go to the emulator. Every component runs on the test's manual
// clock; the test waits for the outbox to settle by polling, never by
// sleeping for a duration the code depends on.

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/cutover"
	"github.com/aurora-billing/aurora/deliverer"
	"github.com/aurora-billing/aurora/deliverer/stripeexport"
	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/relay"
	"github.com/aurora-billing/aurora/reporter"
	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/natstest"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/aurora-billing/aurora/shared/usage"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// startPipeline runs a relay and a deliverer against p until the test ends.
func startPipeline(t *testing.T, p *pipeline) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	srv := natstest.New(t)
	nc, err := nats.Connect(srv.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := relay.EnsureStream(ctx, js, relay.DefaultStreamConfig()); err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	rcfg := relay.DefaultConfig()
	rcfg.PollMS, rcfg.Workers = 20, 2
	rl, err := relay.New(p.pool, js, rcfg, relay.WithClock(p.clk), relay.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	exp, err := stripeexport.New(stripeexport.Config{APIKey: "sk_test_cutover", APIBase: p.url}, 10*time.Second, 8)
	if err != nil {
		t.Fatal(err)
	}
	dcfg := deliverer.DefaultConfig()
	dcfg.Concurrency, dcfg.BusyDelayMillis, dcfg.ShutdownSeconds = 8, 20, 10
	dl, err := deliverer.New(p.pool, js, exp, dcfg, deliverer.WithClock(p.clk), deliverer.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	// The deliverer's consumer first, then the relay: the embedded server
	// races a stream update (the relay's EnsureStream at start) against a
	// concurrent consumer creation (nats-server's own data race under -race).
	done := make(chan error, 2)
	go func() { done <- dl.Run(ctx) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if dl.Ready() == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the deliverer's partition consumers did not appear")
		}
		time.Sleep(10 * time.Millisecond)
	}
	go func() { done <- rl.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		for range 2 {
			if err := <-done; err != nil {
				t.Errorf("pipeline: %v", err)
			}
		}
		nc.Close()
	})
}

// settle waits until nothing is pending or leased.
func (p *pipeline) settle() {
	p.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var open int
		if err := p.pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox_items WHERE state IN ('pending', 'leased')`).Scan(&open); err != nil {
			p.t.Fatal(err)
		}
		if open == 0 {
			return
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("%d items still pending or leased after 30 s", open)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestCutoverThroughRelayAndDeliverer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(dbtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	// The clock runs ahead of the real one (rows are due by the database's
	// now() at insert), on days of its own: the watermark is a UTC midnight
	// three days from now.
	watermark := time.Now().UTC().Truncate(24*time.Hour).AddDate(0, 0, 3)
	p := newPipelineOn(t, pool, watermark.Add(-36*time.Hour))
	startPipeline(t, p)
	r := &reporter.Reporter{Pool: p.pool, Recorder: rec, Clock: p.clk}

	p.use("org_a", 3, 0)
	p.clk.Advance(20 * time.Hour) // W − 16 h
	p.use("org_a", 5, 0)
	p.use("org_b", 2, 0)
	if res := p.report(r); res.Staged != 3 {
		t.Fatalf("first pass: %+v", res)
	}
	p.settle()

	if _, err := cutover.Schedule(ctx, p.pool, cutover.ScheduleInput{Feature: "api_calls", At: watermark, Actor: "liam"}); err != nil {
		t.Fatal(err)
	}
	p.clk.Advance(15*time.Hour + 59*time.Minute) // W − 1 min
	p.use("org_a", 4, 0)
	p.use("org_b", 1, 0)
	p.report(r)
	p.settle()
	p.clk.Advance(time.Minute) // W
	firstRecorded := p.use("org_b", 7, 0)
	p.use("org_a", 2, 30*time.Second) // late: belongs to the last buffered period
	p.settle()
	p.clk.Advance(9 * time.Hour)
	bigOct := p.use("org_a", 6, 0)
	p.report(r)
	p.settle()
	p.report(r)
	if st := p.status(); !st.Drained || st.BufferedPeriodsOpen != 0 || st.EventItems != 2 {
		t.Fatalf("status: %+v", st)
	}

	// The source switch, then recording-era corrections. The deliverer
	// sends a positive correction as a compensating event; a negative one
	// (usage.PlanCorrection, 10 h after its record reached Stripe) cancels
	// the corrected event and restates 7 − 2 under its own identifier.
	r.Sources = usage.Sources{"api_calls": usage.SourceEvents}
	p.gate.Sources = r.Sources
	p.clk.Advance(time.Hour)
	p.correct("org_a", "fix-up", bigOct, 1, watermark.Add(9*time.Hour))
	p.correct("org_b", "fix-down", firstRecorded, -2, watermark.Add(time.Minute))
	p.settle() // inside the 23 h cancel window of firstRecorded
	p.clk.Advance(24 * time.Hour)
	p.use("org_b", 5, 0)
	if res := p.report(r); res.Staged != 0 {
		t.Fatalf("pass after the switch staged %d windows", res.Staged)
	}
	p.settle()

	rows, err := p.pool.Query(ctx, `SELECT `+outbox.Columns+` FROM outbox_items ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (outbox.Row, error) { return outbox.ScanRow(r) })
	if err != nil {
		t.Fatal(err)
	}
	var windows, events int
	for _, it := range items {
		before := it.PeriodStart.Before(watermark)
		switch {
		case it.SubjectRef == "correction:fix-down":
			if it.State != outbox.StateAccepted {
				t.Errorf("negative correction: %s %v", it.State, it.QuarantineReason)
			}
		case it.SubjectKind == identity.SubjectUsageWindow:
			windows++
			if !before || it.State != outbox.StateAccepted {
				t.Errorf("window %s (period %v) in state %s", it.SubjectRef, it.PeriodStart, it.State)
			}
		case before:
			if it.State != outbox.StateQuarantined || *it.QuarantineReason != outbox.ReasonPeriodBuffered {
				t.Errorf("buffered-era %s in state %s", it.SubjectRef, it.State)
			}
		default:
			events++
			if it.State != outbox.StateAccepted {
				t.Errorf("recording-era %s in state %s", it.SubjectRef, it.State)
			}
		}
		if it.State == outbox.StateAccepted && p.emu.Applications(it.IdempotencyKey) != 1 {
			t.Errorf("%s applied %d times", it.SubjectRef, p.emu.Applications(it.IdempotencyKey))
		}
	}
	if windows != 6 || events != 4 { // org_a: 0:3, 0:5, 5:9, 9:11; org_b: 0:2, 2:3
		t.Errorf("%d windows and %d recording-era items accepted, want 6 and 4", windows, events)
	}
	if dups := p.emu.DuplicateApplications(); len(dups) != 0 {
		t.Errorf("identifiers applied twice: %v", dups)
	}
	billed := p.billed()
	var total int64
	for tenant, want := range p.recorded {
		total += want
		if billed[tenant] != float64(want) {
			t.Errorf("%s: billed %v, recorded %d", tenant, billed[tenant], want)
		}
	}
	if got := p.emu.AppliedTotals()["api_calls"]; got != float64(total) {
		t.Errorf("applied total %v, usage recorded %d", got, total)
	}
}
