package reporter_test

// The cutover across a period boundary, end to end against the Stripe
// emulator: the application writes every unit of usage both as a counter
// increment and as a durable event (the transition), the watermark decides
// which side exports each period, and the emulator's applied total must equal
// the usage recorded — nothing billed twice, nothing dropped at the boundary.
//
// Delivery here is driven by the test itself (claim a pending row, fence by
// lease_token, run the seed's period_buffered pre-send check, send with
// stripe-go, record the outcome) so the test exercises this package's side
// of the contract; corrections go through usage.PlanCorrection, which is how
// a negative correction is cancelled and restated within Stripe's 24 h.

import (
	"context"
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/cutover"
	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/provision"
	"github.com/aurora-billing/aurora/reporter"
	"github.com/aurora-billing/aurora/shared/clock"
	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/aurora-billing/aurora/shared/usage"
	"github.com/aurora-billing/aurora/stripeemulator"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/client"
)

const account = "acct_1Test"

type pipeline struct {
	t    *testing.T
	pool *pgxpool.Pool
	clk  *clock.Manual
	emu  *stripeemulator.Emulator
	url  string // the emulator's base URL
	api  *client.API
	gate usage.Gate
	seq  int
	// recorded is the usage the application recorded, per tenant: what
	// must be billed exactly once.
	recorded map[string]int64
}

func newPipeline(t *testing.T, start time.Time) *pipeline {
	t.Helper()
	return newPipelineOn(t, dbtest.New(t), start)
}

// newPipelineOn provisions, through the same code paths an operator uses,
// a confirmed test account, the api_calls meter and customers for org_a and
// org_b in an emulator whose clock is the test's manual clock.
func newPipelineOn(t *testing.T, pool *pgxpool.Pool, start time.Time) *pipeline {
	t.Helper()
	ctx := context.Background()
	clk := clock.NewManual(start)
	emu, err := stripeemulator.New(stripeemulator.Config{Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(emu)
	t.Cleanup(srv.Close)
	p := &pipeline{t: t, pool: pool, clk: clk, emu: emu, url: srv.URL,
		api:      provision.NewAPI("sk_test_cutover", srv.URL, srv.Client()),
		gate:     usage.Gate{Recorder: rec},
		recorded: map[string]int64{}}
	if err := provision.Account(ctx, p.pool, account, identity.ModeTest, true); err != nil {
		t.Fatal(err)
	}
	if _, err := provision.Meter(ctx, p.pool, p.api, account, "api_calls", "api_calls"); err != nil {
		t.Fatal(err)
	}
	for _, tenant := range []string{"org_a", "org_b"} {
		if _, _, err := provision.Customer(ctx, p.pool, p.api, account, tenant); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// use is the application: one request of n units at the current clock
// minus lateBy, counted and recorded in one transaction.
func (p *pipeline) use(tenant string, n int64, lateBy time.Duration) string {
	p.t.Helper()
	ctx := context.Background()
	p.seq++
	id := fmt.Sprintf("req-%d", p.seq)
	at := p.clk.Now().Add(-lateBy)
	err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		if _, err := rec.Increment(ctx, tx, tenant, "api_calls", at, n); err != nil {
			return err
		}
		_, _, err := p.gate.Record(ctx, tx, usage.Event{Tenant: tenant, EventID: id, Feature: "api_calls", Quantity: n, OccurredAt: at})
		return err
	})
	if err != nil {
		p.t.Fatal(err)
	}
	p.recorded[tenant] += n
	return id
}

func (p *pipeline) correct(tenant, id, corrects string, delta int64, at time.Time) {
	p.t.Helper()
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		_, _, err := p.gate.Record(ctx, tx, usage.Event{Tenant: tenant, EventID: id, Feature: "api_calls", Quantity: delta,
			OccurredAt: at, CorrectsEventID: corrects})
		return err
	})
	if err != nil {
		p.t.Fatal(err)
	}
	p.recorded[tenant] += delta
}

func (p *pipeline) report(r *reporter.Reporter) reporter.PassResult {
	p.t.Helper()
	res, err := r.Pass(context.Background())
	if err != nil {
		p.t.Fatal(err)
	}
	return res
}

// deliver sends every item pending now, once, and returns how many it
// attempted.
func (p *pipeline) deliver() int {
	p.t.Helper()
	ctx := context.Background()
	rows, err := p.pool.Query(ctx, `SELECT id FROM outbox_items WHERE state = 'pending' ORDER BY id`)
	if err != nil {
		p.t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		p.t.Fatal(err)
	}
	for _, id := range ids {
		p.deliverOne(id)
	}
	return len(ids)
}

func (p *pipeline) deliverOne(id int64) {
	p.t.Helper()
	ctx := context.Background()
	now := p.clk.Now()
	var token int64
	err := p.pool.QueryRow(ctx, `
		UPDATE outbox_items SET state = 'leased', lease_token = lease_token + 1, attempts = attempts + 1,
			first_attempt_at = coalesce(first_attempt_at, $2), lease_expires_at = $2::timestamptz + interval '2 minutes'
		WHERE id = $1 AND state = 'pending' RETURNING lease_token`, id, now).Scan(&token)
	if err != nil {
		p.t.Fatal(err)
	}
	row, err := outbox.Get(ctx, p.pool, id)
	if err != nil {
		p.t.Fatal(err)
	}
	finish := func(state outbox.State, reason *outbox.Reason) {
		p.t.Helper()
		tag, err := p.pool.Exec(ctx, `UPDATE outbox_items SET state = $3, quarantine_reason = $4, lease_expires_at = NULL
			WHERE id = $1 AND state = 'leased' AND lease_token = $2`, id, token, string(state), reason)
		if err != nil || tag.RowsAffected() != 1 {
			p.t.Fatalf("outcome of item %d: %v (%d rows)", id, err, tag.RowsAffected())
		}
	}
	var eventName, customer string
	if err := p.pool.QueryRow(ctx, `SELECT m.event_name, b.stripe_customer FROM meter_mappings m, tenant_billing b
		WHERE m.destination_account = $1 AND m.feature = $2 AND b.destination_account = $1 AND b.tenant = $3`,
		row.DestinationAccount, row.Feature, row.Tenant).Scan(&eventName, &customer); err != nil {
		p.t.Fatal(err)
	}
	// Seed 000's pre-send check, again at send time: an event for a
	// buffered period is quarantined period_buffered.
	if row.SubjectKind != identity.SubjectUsageWindow {
		w, ok, err := usage.WatermarkFor(ctx, p.pool, row.Tenant, row.Feature)
		if err != nil {
			p.t.Fatal(err)
		}
		if ok && row.PeriodStart.Before(w.At) {
			r := outbox.ReasonPeriodBuffered
			finish(outbox.StateQuarantined, &r)
			return
		}
	}
	value := row.Quantity
	if row.SubjectKind == identity.SubjectCorrection {
		plan, err := usage.PlanCorrection(ctx, p.pool, row, &now)
		if err != nil {
			p.t.Fatal(err)
		}
		switch plan.Action {
		case usage.CorrectionWait:
			finish(outbox.StatePending, nil)
			return
		case usage.CorrectionNotCancellable:
			r := outbox.ReasonNegativeQuantity
			finish(outbox.StateQuarantined, &r)
			return
		case usage.CorrectionCancelRestate:
			params := &stripe.BillingMeterEventAdjustmentParams{EventName: stripe.String(eventName), Type: stripe.String("cancel"),
				Cancel: &stripe.BillingMeterEventAdjustmentCancelParams{Identifier: stripe.String(plan.CancelIdentifier)}}
			params.SetIdempotencyKey(plan.CancelIdempotencyKey)
			if _, err := p.api.BillingMeterEventAdjustments.New(params); err != nil {
				p.t.Fatalf("cancel: %v", err)
			}
			if plan.Value == 0 {
				finish(outbox.StateAccepted, nil)
				return
			}
		case usage.CorrectionSendEvent:
		}
		value = plan.Value
	}
	params := &stripe.BillingMeterEventParams{EventName: stripe.String(eventName), Identifier: stripe.String(row.IdempotencyKey),
		Payload:   map[string]string{provision.CustomerKey: customer, provision.ValueKey: fmt.Sprint(value)},
		Timestamp: stripe.Int64(row.OccurredAt.Unix())}
	params.SetIdempotencyKey(row.IdempotencyKey)
	if _, err := p.api.BillingMeterEvents.New(params); err != nil {
		p.t.Fatalf("send item %d (%s): %v", id, row.SubjectRef, err)
	}
	finish(outbox.StateAccepted, nil)
}

func (p *pipeline) billed() map[string]float64 {
	out := map[string]float64{}
	customers := map[string]string{}
	rows, _ := p.pool.Query(context.Background(), `SELECT stripe_customer, tenant FROM tenant_billing`)
	for rows.Next() {
		var c, t string
		_ = rows.Scan(&c, &t)
		customers[c] = t
	}
	rows.Close()
	for _, ev := range p.emu.Applied() {
		if !ev.Cancelled {
			out[customers[ev.Customer]] += ev.Value
		}
	}
	return out
}

func (p *pipeline) status() cutover.Status {
	p.t.Helper()
	st, err := cutover.StatusOf(context.Background(), p.pool, "", "api_calls", p.clk)
	if err != nil {
		p.t.Fatal(err)
	}
	return st
}

func TestCutoverAcrossAPeriodBoundary(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	watermark := time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC)
	p := newPipeline(t, watermark.Add(-36*time.Hour)) // Sep 29, 12:00
	r := &reporter.Reporter{Pool: p.pool, Recorder: rec, Clock: p.clk}

	// Counting era, no watermark yet: the events the application also
	// records are quarantined period_buffered at record time.
	p.use("org_a", 3, 0)
	p.clk.Advance(20 * time.Hour) // Sep 30, 08:00
	p.use("org_a", 5, 0)
	p.use("org_b", 2, 0)
	if res := p.report(r); res.Staged != 3 {
		t.Fatalf("first pass: %+v", res)
	}
	p.deliver()

	// 1. Schedule the cutover at the next period boundary.
	if _, err := cutover.Schedule(ctx, p.pool, cutover.ScheduleInput{Feature: "api_calls", At: watermark, Actor: "liam"}); err != nil {
		t.Fatal(err)
	}
	// 2. Keep the reporter running across the boundary.
	p.clk.Advance(15*time.Hour + 59*time.Minute) // Sep 30, 23:59
	p.use("org_a", 4, 0)
	lastBuffered := p.use("org_b", 1, 0)
	p.report(r)
	p.deliver()
	if st := p.status(); st.Drained || st.WatermarkPassed {
		t.Fatalf("drained before the watermark: %+v", st)
	}
	p.clk.Advance(time.Minute) // Oct 1, 00:00:00 exactly: the first recording-era instant
	firstRecorded := p.use("org_b", 7, 0)
	late := p.use("org_a", 2, 30*time.Second) // a Sep 30 23:59:30 request that arrives late
	p.clk.Advance(9 * time.Hour)              // Oct 1, 09:00
	bigOct := p.use("org_a", 6, 0)
	p.report(r) // stages the late Sep 30 window, never an October one
	p.deliver()
	if st := p.status(); st.Drained || st.BufferedPeriodsOpen != 1 {
		t.Fatalf("drained before the reporter saw the last window accepted: %+v", st)
	}
	p.report(r) // advances the ledger past the accepted window
	if st := p.status(); !st.Drained || st.BufferedPeriodsOpen != 0 || st.EventItems != 2 {
		t.Fatalf("status after the boundary: %+v", st)
	}

	// 3. Only now switch the source (a deploy: AURORA_FEATURE_SOURCES).
	r.Sources = usage.Sources{"api_calls": usage.SourceEvents}
	p.gate.Sources = r.Sources
	// Corrections in the recording era: −2 of bigOct within Stripe's 24 h
	// (cancel it and restate 4), then +1 (a compensating event).
	p.clk.Set(watermark.Add(20 * time.Hour)) // Oct 1, 20:00: 11 h after bigOct was sent
	p.correct("org_a", "fix-1", bigOct, -2, watermark.Add(9*time.Hour))
	p.correct("org_a", "fix-2", bigOct, 1, watermark.Add(9*time.Hour))
	p.deliver()
	p.clk.Set(watermark.Add(33 * time.Hour)) // Oct 2, 09:00
	p.use("org_b", 5, 0)
	// −1 of firstRecorded, sent 33 h ago: past the cancel window, and a sum
	// meter cannot take a negative event: quarantined negative_quantity,
	// visible, never applied (a person credits it).
	p.correct("org_b", "fix-3", firstRecorded, -1, watermark.Add(time.Hour))
	if res := p.report(r); res.Staged != 0 {
		t.Fatalf("pass after the switch staged %d windows", res.Staged)
	}
	p.deliver()
	fix3, err := outbox.ScanRow(p.pool.QueryRow(ctx, `SELECT `+outbox.Columns+` FROM outbox_items WHERE subject_ref = 'correction:fix-3'`))
	if err != nil {
		t.Fatal(err)
	}
	if fix3.State != outbox.StateQuarantined || *fix3.QuarantineReason != outbox.ReasonNegativeQuantity {
		t.Fatalf("late negative correction: %s %v", fix3.State, fix3.QuarantineReason)
	}
	p.recorded["org_b"]++ // not billed: the quarantined −1 is an operator's to credit

	// Every item is resolved; windows only before the watermark, events
	// only on or after it.
	rows, err := p.pool.Query(ctx, `SELECT `+outbox.Columns+` FROM outbox_items ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (outbox.Row, error) { return outbox.ScanRow(r) })
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range items {
		before := it.PeriodStart.Before(watermark)
		switch {
		case it.SubjectKind == identity.SubjectUsageWindow && (!before || it.State != outbox.StateAccepted):
			t.Errorf("window %s in state %s", it.SubjectRef, it.State)
		case it.SubjectKind != identity.SubjectUsageWindow && before &&
			(it.State != outbox.StateQuarantined || *it.QuarantineReason != outbox.ReasonPeriodBuffered):
			t.Errorf("buffered-era %s %s in state %s", it.SubjectKind, it.SubjectRef, it.State)
		case it.SubjectRef == "correction:fix-3":
		case it.SubjectKind != identity.SubjectUsageWindow && !before && it.State != outbox.StateAccepted:
			t.Errorf("recording-era %s %s in state %s", it.SubjectKind, it.SubjectRef, it.State)
		}
		if it.State == outbox.StateAccepted && p.emu.Applications(it.IdempotencyKey) != 1 {
			t.Errorf("%s applied %d times", it.SubjectRef, p.emu.Applications(it.IdempotencyKey))
		}
	}
	// The boundary: the last buffered unit went out inside a window, the
	// first recorded unit as its own event.
	var lastState, firstState string
	_ = p.pool.QueryRow(ctx, `SELECT i.state FROM usage_events e JOIN outbox_items i ON i.id = e.item_id WHERE e.event_id = $1`, lastBuffered).Scan(&lastState)
	_ = p.pool.QueryRow(ctx, `SELECT i.state FROM usage_events e JOIN outbox_items i ON i.id = e.item_id WHERE e.event_id = $1`, firstRecorded).Scan(&firstState)
	if lastState != "quarantined" || firstState != "accepted" {
		t.Errorf("boundary events: last buffered %s, first recorded %s", lastState, firstState)
	}
	var lateWindow int
	_ = p.pool.QueryRow(ctx, `SELECT count(*) FROM outbox_items WHERE subject_ref = 'usage:api_calls:2026-09-30T00:00:00Z:9:11'`).Scan(&lateWindow)
	if lateWindow != 1 {
		t.Errorf("the late Sep 30 request (%s) did not go out as the window 9:11", late)
	}

	if dups := p.emu.DuplicateApplications(); len(dups) != 0 {
		t.Errorf("identifiers applied twice: %v", dups)
	}
	billed := p.billed()
	for tenant, want := range p.recorded {
		if billed[tenant] != float64(want) {
			t.Errorf("%s: billed %v, recorded %d", tenant, billed[tenant], want)
		}
	}
	var total int64
	for _, n := range p.recorded {
		total += n
	}
	if got := p.emu.AppliedTotals()["api_calls"]; got != float64(total) {
		t.Errorf("applied total %v, usage recorded %d", got, total)
	}
	var cancelled int
	for _, ev := range p.emu.Applied() {
		if ev.Cancelled {
			cancelled++
		}
	}
	if cancelled != 1 {
		t.Errorf("%d cancelled events, want 1 (bigOct, restated by its correction)", cancelled)
	}
}
