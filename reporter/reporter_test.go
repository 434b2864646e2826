package reporter_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/reporter"
	"github.com/aurora-billing/aurora/shared/clock"
	"github.com/aurora-billing/aurora/shared/config"
	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/aurora-billing/aurora/shared/usage"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

var (
	sept1 = time.Date(2026, 9, 1, 0, 0, 0, 0, time.UTC)
	rec   = usage.Recorder{DestinationAccount: "acct_1Test", Mode: identity.ModeTest, Period: usage.PeriodDay}
)

func newReporter(pool *pgxpool.Pool, clk clock.Clock, sources usage.Sources) *reporter.Reporter {
	return &reporter.Reporter{Pool: pool, Recorder: rec, Clock: clk, Sources: sources, BatchSize: 2,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

func increment(t *testing.T, pool *pgxpool.Pool, tenant string, at time.Time, n int64) {
	t.Helper()
	ctx := context.Background()
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := rec.Increment(ctx, tx, tenant, "api_calls", at, n)
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

func setState(t *testing.T, pool *pgxpool.Pool, id int64, state outbox.State) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `UPDATE outbox_items SET state = $2 WHERE id = $1`, id, string(state)); err != nil {
		t.Fatal(err)
	}
}

// abandon does what recovery's abandon does to a window (schema comment on
// usage_windows): the item becomes rejected, the staged link is cleared and
// the generation bumped.
func abandon(t *testing.T, pool *pgxpool.Pool, id int64) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `
		UPDATE outbox_items SET state = 'rejected' WHERE id = $1;`, id); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(context.Background(), `
		UPDATE usage_windows SET staged_item_id = NULL, generation = generation + 1 WHERE staged_item_id = $1`, id); err != nil {
		t.Fatal(err)
	}
}

func ledger(t *testing.T, pool *pgxpool.Pool, tenant string, start time.Time) (ackTo int64, generation int, staged *int64) {
	t.Helper()
	err := pool.QueryRow(context.Background(), `SELECT acknowledged_to, generation, staged_item_id FROM usage_windows
		WHERE tenant = $1 AND feature = 'api_calls' AND period_start = $2`, tenant, start).Scan(&ackTo, &generation, &staged)
	if err != nil {
		t.Fatal(err)
	}
	return
}

func itemCount(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox_items`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestWindowIdentitiesRestageAcceptAbandon(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	clk := clock.NewManual(sept1.Add(12 * time.Hour))
	r := newReporter(pool, clk, nil)

	increment(t, pool, "org_123", sept1.Add(10*time.Hour), 5)
	first, err := r.ReportPeriod(ctx, "org_123", "api_calls", sept1)
	if err != nil {
		t.Fatal(err)
	}
	const vector = "77ccacd8c75a588c78de426666baa67e43c34992cb5ab11df4a94afe3e8601fc" // README test vector
	if first.Outcome != reporter.OutcomeStaged || first.Window.SubjectRef != "usage:api_calls:2026-09-01T00:00:00Z:0:5" ||
		first.Window.IdempotencyKey != vector || first.Window.Quantity != 5 || first.Window.State != outbox.StatePending {
		t.Fatalf("first window: %+v", first)
	}
	if want := sept1.Add(12 * time.Hour); !first.Window.OccurredAt.Equal(want) {
		t.Fatalf("occurred_at of an open period = %v, want now %v", first.Window.OccurredAt, want)
	}

	// Restaging the unacknowledged window collapses onto the same row, also
	// after the count grew while it is pending: the window is left alone.
	for _, grow := range []int64{0, 3} {
		increment(t, pool, "org_123", sept1.Add(11*time.Hour), grow)
		again, err := r.ReportPeriod(ctx, "org_123", "api_calls", sept1)
		if err != nil {
			t.Fatal(err)
		}
		if again.Outcome != reporter.OutcomeOpen || again.Window.ID != first.Window.ID || again.Window.IdempotencyKey != vector {
			t.Fatalf("restage after +%d: %+v", grow, again)
		}
	}
	if n := itemCount(t, pool); n != 1 {
		t.Fatalf("%d items after restaging, want 1", n)
	}

	// Acceptance advances the ledger; the next window is a new identity
	// starting at the upper bound.
	setState(t, pool, first.Window.ID, outbox.StateAccepted)
	second, err := r.ReportPeriod(ctx, "org_123", "api_calls", sept1)
	if err != nil {
		t.Fatal(err)
	}
	wantRef := "usage:api_calls:2026-09-01T00:00:00Z:5:8"
	if !second.Advanced || second.Outcome != reporter.OutcomeStaged || second.Window.SubjectRef != wantRef ||
		second.Window.Quantity != 3 || second.Window.IdempotencyKey != identity.Key("org_123", identity.SubjectUsageWindow, wantRef, "acct_1Test") ||
		second.Window.IdempotencyKey == vector {
		t.Fatalf("second window: %+v", second)
	}
	if ack, g, staged := ledger(t, pool, "org_123", sept1); ack != 5 || g != 0 || staged == nil || *staged != second.Window.ID {
		t.Fatalf("ledger after acceptance: %d %d %v", ack, g, staged)
	}

	// An abandon restages the same bounds under a new identity.
	abandon(t, pool, second.Window.ID)
	third, err := r.ReportPeriod(ctx, "org_123", "api_calls", sept1)
	if err != nil {
		t.Fatal(err)
	}
	wantRef = "usage:api_calls:2026-09-01T00:00:00Z:5:8:r1"
	if third.Outcome != reporter.OutcomeStaged || third.Window.SubjectRef != wantRef || third.Window.Quantity != 3 ||
		third.Window.IdempotencyKey != identity.Key("org_123", identity.SubjectUsageWindow, wantRef, "acct_1Test") ||
		third.Window.IdempotencyKey == second.Window.IdempotencyKey || third.Window.ID == second.Window.ID {
		t.Fatalf("window after abandon: %+v", third)
	}
	old, err := outbox.Get(ctx, pool, second.Window.ID)
	if err != nil || old.State != outbox.StateRejected {
		t.Fatalf("abandoned item: %v %v", old.State, err)
	}

	// Accepting the restaged window closes the period: nothing more to stage.
	setState(t, pool, third.Window.ID, outbox.StateConfirmed)
	last, err := r.ReportPeriod(ctx, "org_123", "api_calls", sept1)
	if err != nil || !last.Advanced || last.Outcome != reporter.OutcomeIdle {
		t.Fatalf("after final acceptance: %+v %v", last, err)
	}
	if ack, g, staged := ledger(t, pool, "org_123", sept1); ack != 8 || g != 1 || staged != nil {
		t.Fatalf("final ledger: %d %d %v", ack, g, staged)
	}
	if n := itemCount(t, pool); n != 3 {
		t.Fatalf("%d items, want 3", n)
	}
}

func TestClosedPeriodTimestampIsPeriodEndMinusOneSecond(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	r := newReporter(pool, clock.NewManual(sept1.AddDate(0, 0, 4)), nil)
	increment(t, pool, "org_1", sept1.Add(time.Hour), 2)
	res, err := r.ReportPeriod(context.Background(), "org_1", "api_calls", sept1)
	if err != nil {
		t.Fatal(err)
	}
	if want := sept1.Add(24*time.Hour - time.Second); !res.Window.OccurredAt.Equal(want) || !res.Window.PeriodStart.Equal(sept1) {
		t.Fatalf("occurred_at %v period %v, want %v", res.Window.OccurredAt, res.Window.PeriodStart, want)
	}
}

func TestPassStagesOnlyPeriodsBeforeTheWatermark(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	oct1 := time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC)
	// org_a follows the all-tenants watermark (Oct 1); org_b has its own (Sep 30).
	if _, err := pool.Exec(ctx, `INSERT INTO usage_cutovers (tenant, feature, watermark, scheduled_by) VALUES
		('', 'api_calls', $1, 'test'), ('org_b', 'api_calls', $2, 'test')`, oct1, oct1.AddDate(0, 0, -1)); err != nil {
		t.Fatal(err)
	}
	for _, tenant := range []string{"org_a", "org_b"} {
		for _, day := range []time.Time{oct1.AddDate(0, 0, -2), oct1.AddDate(0, 0, -1), oct1, oct1.AddDate(0, 0, 1)} {
			increment(t, pool, tenant, day.Add(time.Hour), 4)
		}
	}
	r := newReporter(pool, clock.NewManual(oct1.AddDate(0, 0, 3)), nil)
	res, err := r.Pass(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Staged != 3 || res.Examined != 3 {
		t.Fatalf("pass: %+v, want 3 staged of 3 examined", res)
	}
	rows, err := pool.Query(ctx, `SELECT tenant || ' ' || subject_ref FROM outbox_items ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"org_a usage:api_calls:2026-09-29T00:00:00Z:0:4",
		"org_a usage:api_calls:2026-09-30T00:00:00Z:0:4",
		"org_b usage:api_calls:2026-09-29T00:00:00Z:0:4",
	}
	if len(got) != len(want) {
		t.Fatalf("staged %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("staged %v, want %v", got, want)
		}
	}
	// A recording-era period asked for directly is refused too.
	pr, err := r.ReportPeriod(ctx, "org_a", "api_calls", oct1)
	if err != nil || pr.Outcome != reporter.OutcomeRecording {
		t.Fatalf("recording period: %+v %v", pr, err)
	}
}

func TestSourceEventsWithoutWatermarkStagesNothing(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	increment(t, pool, "org_1", sept1.Add(time.Hour), 7)
	r := newReporter(pool, clock.NewManual(sept1.AddDate(0, 0, 2)), usage.Sources{"api_calls": usage.SourceEvents})
	res, err := r.Pass(ctx)
	if err != nil || res.Recording != 1 || res.Staged != 0 {
		t.Fatalf("pass %+v %v", res, err)
	}
	// With a watermark after the period the buffered side still drains it,
	// whatever the source says.
	if _, err := pool.Exec(ctx, `INSERT INTO usage_cutovers (tenant, feature, watermark, scheduled_by) VALUES ('', 'api_calls', $1, 'test')`,
		sept1.AddDate(0, 0, 1)); err != nil {
		t.Fatal(err)
	}
	res, err = r.Pass(ctx)
	if err != nil || res.Staged != 1 {
		t.Fatalf("pass with watermark %+v %v", res, err)
	}
}

func TestDriftIsReportedAndStagesNothing(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	increment(t, pool, "org_1", sept1.Add(time.Hour), 2)
	if _, err := pool.Exec(ctx, `INSERT INTO usage_windows (tenant, feature, period_start, acknowledged_to) VALUES ('org_1', 'api_calls', $1, 5)`, sept1); err != nil {
		t.Fatal(err)
	}
	r := newReporter(pool, clock.NewManual(sept1.AddDate(0, 0, 2)), nil)
	_, err := r.ReportPeriod(ctx, "org_1", "api_calls", sept1)
	var de *reporter.DriftError
	if !errors.Is(err, reporter.ErrDrift) || !errors.As(err, &de) || de.Count != 2 || de.AcknowledgedTo != 5 {
		t.Fatalf("got %v", err)
	}
	res, err := r.Pass(ctx)
	if !errors.Is(err, reporter.ErrDrift) || res.Drift != 1 || itemCount(t, pool) != 0 {
		t.Fatalf("pass %+v %v", res, err)
	}
}

func TestConcurrentReportersStageOneWindow(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	for i := range 5 {
		increment(t, pool, "org_1", sept1.AddDate(0, 0, i), 3)
	}
	clk := clock.NewManual(sept1.AddDate(0, 0, 10))
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := newReporter(pool, clk, nil).Pass(ctx)
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := itemCount(t, pool); n != 5 {
		t.Fatalf("%d items, want one window per period (5)", n)
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		env     map[string]string
		wantVar string
	}{
		{map[string]string{}, ""},
		{map[string]string{"AURORA_FEATURE_SOURCES": "api_calls:events, egress_bytes:counters"}, ""},
		{map[string]string{"AURORA_REPORTER_INTERVAL_SECONDS": "0"}, "AURORA_REPORTER_INTERVAL_SECONDS"},
		{map[string]string{"AURORA_REPORTER_BATCH_SIZE": "20000"}, "AURORA_REPORTER_BATCH_SIZE"},
		{map[string]string{"AURORA_REPORTER_WORKERS": "0"}, "AURORA_REPORTER_WORKERS"},
		{map[string]string{"AURORA_FEATURE_SOURCES": "api_calls:stream"}, "AURORA_FEATURE_SOURCES"},
		{map[string]string{"AURORA_FEATURE_SOURCES": "api_calls"}, "AURORA_FEATURE_SOURCES"},
		{map[string]string{"AURORA_FEATURE_SOURCES": "api_calls:events,api_calls:counters"}, "AURORA_FEATURE_SOURCES"},
	}
	for _, tt := range tests {
		var c reporter.Config
		err := config.LoadFrom(&c, tt.env)
		if tt.wantVar == "" {
			if err != nil {
				t.Errorf("%v: %v", tt.env, err)
			}
			continue
		}
		var re *config.RangeError
		if !errors.Is(err, config.ErrInvalid) || !errors.As(err, &re) || re.Var != tt.wantVar {
			t.Errorf("%v: got %v, want a RangeError for %s", tt.env, err, tt.wantVar)
		}
	}
	var c reporter.Config
	if err := config.LoadFrom(&c, map[string]string{"AURORA_FEATURE_SOURCES": "api_calls:events"}); err != nil {
		t.Fatal(err)
	}
	if c.Sources().Of("api_calls") != usage.SourceEvents || c.Sources().Of("other") != usage.SourceCounters || c.Interval() != time.Minute || c.Workers != reporter.WorkersDefault {
		t.Fatalf("config %+v", c)
	}
}
