package cutover_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/cutover"
	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/shared/clock"
	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/aurora-billing/aurora/shared/usage"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

var (
	oct1 = time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC)
	rec  = usage.Recorder{DestinationAccount: "acct_1Test", Mode: identity.ModeTest, Period: usage.PeriodDay}
)

func schedule(ctx context.Context, pool *pgxpool.Pool, tenant, feature string, at time.Time) (cutover.SchedulePlan, error) {
	return cutover.Schedule(ctx, pool, cutover.ScheduleInput{Tenant: tenant, Feature: feature, At: at, Actor: "liam"})
}

func TestScheduleAndAlreadyScheduled(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	plan, err := schedule(ctx, pool, "", "api_calls", oct1)
	if err != nil || plan.Watermark.Version != 1 || !plan.Watermark.At.Equal(oct1) {
		t.Fatalf("schedule: %+v %v", plan, err)
	}
	for _, tenant := range []string{"", "org_123"} { // the all-tenants row governs org_123 too
		_, err := schedule(ctx, pool, tenant, "api_calls", oct1.AddDate(0, 0, 1))
		var ae *cutover.AlreadyScheduledError
		if !errors.Is(err, cutover.ErrAlreadyScheduled) || !errors.As(err, &ae) || !ae.Existing.At.Equal(oct1) || ae.Existing.Tenant != "" {
			t.Fatalf("tenant %q: got %v, want already_scheduled", tenant, err)
		}
	}
	// A tenant's own row first, then the all-tenants row: both allowed; the
	// tenant's second schedule is refused.
	if _, err := schedule(ctx, pool, "org_123", "egress_bytes", oct1); err != nil {
		t.Fatal(err)
	}
	if _, err := schedule(ctx, pool, "", "egress_bytes", oct1.AddDate(0, 1, 0)); err != nil {
		t.Fatal(err)
	}
	if _, err := schedule(ctx, pool, "org_123", "egress_bytes", oct1); !errors.Is(err, cutover.ErrAlreadyScheduled) {
		t.Fatalf("got %v", err)
	}
	w, ok, err := usage.WatermarkFor(ctx, pool, "org_123", "egress_bytes")
	if err != nil || !ok || w.Tenant != "org_123" || !w.At.Equal(oct1) {
		t.Fatalf("governing watermark of org_123: %+v %v %v", w, ok, err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM usage_cutovers`).Scan(&n); err != nil || n != 3 {
		t.Fatalf("%d cutover rows, want 3 (%v)", n, err)
	}
}

func TestScheduleRejectsInvalidInput(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	tests := map[string]cutover.ScheduleInput{
		"feature": {At: oct1, Actor: "liam"},
		"at":      {Feature: "api_calls", At: oct1.Add(time.Hour), Actor: "liam"},
		"actor":   {Feature: "api_calls", At: oct1},
	}
	for field, in := range tests {
		_, err := cutover.Schedule(context.Background(), pool, in)
		var fe *cutover.FieldError
		if !errors.Is(err, cutover.ErrInvalidInput) || !errors.As(err, &fe) || fe.Field != field {
			t.Errorf("%s: got %v", field, err)
		}
	}
	// An hour watermark is fine when the period is an hour.
	if _, err := cutover.Schedule(context.Background(), pool, cutover.ScheduleInput{Feature: "api_calls", At: oct1.Add(time.Hour), Actor: "liam", Period: usage.PeriodHour}); err != nil {
		t.Fatal(err)
	}
}

func recordEvent(t *testing.T, pool *pgxpool.Pool, tenant, id string, at time.Time) outbox.Row {
	t.Helper()
	ctx := context.Background()
	var row outbox.Row
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		row, _, err = rec.Record(ctx, tx, usage.Event{Tenant: tenant, EventID: id, Feature: "api_calls", Quantity: 1, OccurredAt: at})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return row
}

func TestScheduleRefusesWhatWasExportedOnTheOtherSide(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	// A window already acknowledged for Oct 2 (buffered) and an event
	// exported for Sep 29 (recorded): a watermark at Oct 1 would give both
	// periods to the other side.
	if _, err := pool.Exec(ctx, `INSERT INTO usage_windows (tenant, feature, period_start, acknowledged_to) VALUES ('org_1', 'api_calls', $1, 4)`,
		oct1.AddDate(0, 0, 1)); err != nil {
		t.Fatal(err)
	}
	recordEvent(t, pool, "org_2", "e-1", oct1.AddDate(0, 0, -2).Add(time.Hour))
	_, err := schedule(ctx, pool, "", "api_calls", oct1)
	var ce *cutover.ConflictError
	if !errors.Is(err, cutover.ErrExportedAcrossWatermark) || !errors.As(err, &ce) || ce.Windows != 1 || ce.Events != 1 {
		t.Fatalf("got %v", err)
	}
	// Scoped to the tenant: org_3 has nothing exported.
	if _, err := schedule(ctx, pool, "org_3", "api_calls", oct1); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := usage.WatermarkFor(ctx, pool, "org_1", "api_calls"); ok {
		t.Fatal("refused schedule wrote a row")
	}
}

func actions(t *testing.T, pool *pgxpool.Pool) []map[string]any {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
		SELECT action, actor, reason, evidence, expected, observed, applied, refusal, subject, item_id
		FROM recovery_actions ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToMap)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestRescheduleAppliedAndRefused(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	if _, err := schedule(ctx, pool, "", "api_calls", oct1); err != nil {
		t.Fatal(err)
	}
	oct2 := oct1.AddDate(0, 0, 1)
	in := cutover.RescheduleInput{Feature: "api_calls", At: oct2, Expected: cutover.Expected{Watermark: oct1, Version: 1},
		Reason: "finance asked for the 2nd", Evidence: "ticket FIN-42", Actor: "liam"}

	// Blank reason or evidence: typed error, nothing recorded.
	for _, blank := range []func(*cutover.RescheduleInput){
		func(i *cutover.RescheduleInput) { i.Reason = " " },
		func(i *cutover.RescheduleInput) { i.Evidence = "" },
	} {
		bad := in
		blank(&bad)
		if _, err := cutover.Reschedule(ctx, pool, bad); !errors.Is(err, cutover.ErrInvalidInput) {
			t.Fatalf("got %v", err)
		}
	}
	if a := actions(t, pool); len(a) != 0 {
		t.Fatalf("invalid input recorded %d actions", len(a))
	}

	// The dry run answers the same and writes nothing.
	plan, err := cutover.PlanReschedule(ctx, pool, in)
	if err != nil || plan.After.Version != 2 || !plan.After.At.Equal(oct2) || plan.ActionID != 0 {
		t.Fatalf("plan: %+v %v", plan, err)
	}
	res, err := cutover.Reschedule(ctx, pool, in)
	if err != nil || res.After.Version != 2 || !res.After.At.Equal(oct2) || !res.Before.At.Equal(oct1) || res.ActionID == 0 {
		t.Fatalf("reschedule: %+v %v", res, err)
	}

	// The same call again carries a stale expected state: refused, recorded,
	// and the error tells what the row says now.
	_, err = cutover.Reschedule(ctx, pool, in)
	var mm *cutover.ExpectedStateMismatchError
	if !errors.Is(err, cutover.ErrExpectedStateMismatch) || !errors.As(err, &mm) || mm.Current.Version != 2 || !mm.Current.Watermark.Equal(oct2) {
		t.Fatalf("stale reschedule: %v", err)
	}
	w, _, _ := usage.WatermarkFor(ctx, pool, "org_1", "api_calls")
	if !w.At.Equal(oct2) || w.Version != 2 {
		t.Fatalf("watermark moved by a refused call: %+v", w)
	}

	// Not scheduled: refused and recorded.
	other := in
	other.Feature = "egress_bytes"
	if _, err := cutover.Reschedule(ctx, pool, other); !errors.Is(err, cutover.ErrNotScheduled) {
		t.Fatalf("got %v", err)
	}

	// Moving earlier across a period that already has a window: refused.
	if _, err := pool.Exec(ctx, `INSERT INTO usage_windows (tenant, feature, period_start, acknowledged_to) VALUES ('org_1', 'api_calls', $1, 3)`, oct1); err != nil {
		t.Fatal(err)
	}
	back := in
	back.At, back.Expected = oct1, cutover.Expected{Watermark: oct2, Version: 2}
	_, err = cutover.Reschedule(ctx, pool, back)
	var ce *cutover.ConflictError
	if !errors.Is(err, cutover.ErrExportedAcrossWatermark) || !errors.As(err, &ce) || ce.Windows != 1 {
		t.Fatalf("got %v", err)
	}

	got := actions(t, pool)
	want := []struct {
		applied bool
		refusal any
	}{{true, nil}, {false, "expected_state_mismatch"}, {false, "not_scheduled"}, {false, "exported_across_watermark"}}
	if len(got) != len(want) {
		t.Fatalf("%d actions, want %d: %v", len(got), len(want), got)
	}
	for i, w := range want {
		a := got[i]
		if a["action"] != "reschedule_cutover" || a["applied"] != w.applied || a["refusal"] != w.refusal || a["actor"] != "liam" ||
			a["reason"] != in.Reason || a["evidence"] != in.Evidence || a["item_id"] != nil {
			t.Errorf("action %d: %v", i, a)
		}
	}
	listed, err := cutover.Actions(ctx, pool, "", "api_calls")
	if err != nil || len(listed) != 3 || !listed[0].Applied || listed[1].Refusal == nil || *listed[1].Refusal != cutover.RefusalExpectedStateMismatch {
		t.Fatalf("Actions: %+v %v", listed, err)
	}
	subject, _ := json.Marshal(got[0]["subject"])
	if string(subject) != `{"feature":"api_calls","tenant":""}` {
		t.Errorf("subject %s", subject)
	}
	observed := got[1]["observed"].(map[string]any)
	if observed["version"] != float64(2) || observed["watermark"] != "2026-10-02T00:00:00Z" {
		t.Errorf("observed of the stale call: %v", observed)
	}
	expected := got[1]["expected"].(map[string]any)
	if expected["version"] != float64(1) || expected["watermark"] != "2026-10-01T00:00:00Z" || expected["requested_watermark"] != "2026-10-02T00:00:00Z" {
		t.Errorf("expected of the stale call: %v", expected)
	}
}

func TestStatusDrainsWhenBufferedPeriodsAreAcknowledged(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	if _, err := schedule(ctx, pool, "", "api_calls", oct1); err != nil {
		t.Fatal(err)
	}
	sep30 := oct1.AddDate(0, 0, -1)
	if _, err := pool.Exec(ctx, `
		INSERT INTO usage_counters (tenant, feature, period_start, count) VALUES
			('org_1', 'api_calls', $1, 5), ('org_2', 'api_calls', $1, 2), ('org_1', 'api_calls', $2, 9)`, sep30, oct1); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO usage_windows (tenant, feature, period_start, acknowledged_to) VALUES ('org_1', 'api_calls', $1, 5)`, sep30); err != nil {
		t.Fatal(err)
	}
	recordEvent(t, pool, "org_1", "e-1", oct1.Add(time.Hour))
	recordEvent(t, pool, "org_1", "e-0", sep30.Add(time.Hour)) // buffered era: not an event item of the cutover
	clk := clock.NewManual(sep30.Add(12 * time.Hour))

	st, err := cutover.StatusOf(ctx, pool, "", "api_calls", clk)
	if err != nil {
		t.Fatal(err)
	}
	if st.BufferedPeriodsOpen != 1 || st.EventItems != 1 || st.WatermarkPassed || st.Drained || st.Version != 1 || st.Governing != "all_tenants" {
		t.Fatalf("status before: %+v", st)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO usage_windows (tenant, feature, period_start, acknowledged_to) VALUES ('org_2', 'api_calls', $1, 2)`, sep30); err != nil {
		t.Fatal(err)
	}
	st, _ = cutover.StatusOf(ctx, pool, "", "api_calls", clk)
	if st.BufferedPeriodsOpen != 0 || st.Drained {
		t.Fatalf("status before the watermark passed: %+v", st)
	}
	clk.Set(oct1.Add(time.Minute))
	st, _ = cutover.StatusOf(ctx, pool, "", "api_calls", clk)
	if !st.WatermarkPassed || !st.Drained {
		t.Fatalf("status after: %+v", st)
	}
	// Per tenant.
	st, err = cutover.StatusOf(ctx, pool, "org_2", "api_calls", clk)
	if err != nil || st.EventItems != 0 || !st.Drained || st.Governing != "all_tenants" {
		t.Fatalf("org_2: %+v %v", st, err)
	}
	if _, err := cutover.StatusOf(ctx, pool, "", "egress_bytes", clk); !errors.Is(err, cutover.ErrNotScheduled) {
		t.Fatalf("got %v", err)
	}
}
