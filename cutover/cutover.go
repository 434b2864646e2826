package cutover

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aurora-billing/aurora/shared/clock"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/aurora-billing/aurora/shared/usage"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

var (
	// ErrAlreadyScheduled: the feature already has a cutover governing this
	// tenant (seed 000, {:error, :already_scheduled}); move it with
	// Reschedule. The concrete error is *AlreadyScheduledError.
	ErrAlreadyScheduled = errors.New("cutover: already_scheduled")
	// ErrNotScheduled: no cutover row for (tenant, feature).
	ErrNotScheduled = errors.New("cutover: not_scheduled")
	// ErrExpectedStateMismatch: the cutover is not what the caller expected
	// (seed 000, {:error, {:expected_state_mismatch, current}}). The
	// concrete error is *ExpectedStateMismatchError carrying the row now.
	ErrExpectedStateMismatch = errors.New("cutover: expected_state_mismatch")
	// ErrExportedAcrossWatermark: the new watermark would give a period to
	// one side after the other side already exported it (a double bill).
	// The concrete error is *ConflictError.
	ErrExportedAcrossWatermark = errors.New("cutover: exported_across_watermark")
	// ErrInvalidInput: see *FieldError.
	ErrInvalidInput = errors.New("cutover: invalid input")
)

// FieldError names the invalid input field. It wraps ErrInvalidInput.
type FieldError struct{ Field, Reason string }

func (e *FieldError) Error() string { return "cutover: invalid " + e.Field + ": " + e.Reason }

// Unwrap returns ErrInvalidInput.
func (e *FieldError) Unwrap() error { return ErrInvalidInput }

// AlreadyScheduledError carries the cutover that already governs the
// tenant. It wraps ErrAlreadyScheduled.
type AlreadyScheduledError struct{ Existing usage.Watermark }

func (e *AlreadyScheduledError) Error() string {
	scope := "all tenants"
	if e.Existing.Tenant != "" {
		scope = "this tenant"
	}
	return fmt.Sprintf("cutover: already_scheduled: %s has a cutover for %s at %s (version %d); move it with reschedule",
		e.Existing.Feature, scope, e.Existing.At.Format(time.RFC3339), e.Existing.Version)
}

// Unwrap returns ErrAlreadyScheduled.
func (e *AlreadyScheduledError) Unwrap() error { return ErrAlreadyScheduled }

// Expected is the expected state of a cutover: what the operator read.
type Expected struct {
	Watermark time.Time `json:"watermark"`
	Version   int32     `json:"version"`
}

// ExpectedStateMismatchError: the row differs from Expected; Current is
// what it says now. It wraps ErrExpectedStateMismatch.
type ExpectedStateMismatchError struct {
	Expected Expected
	Current  Expected
}

func (e *ExpectedStateMismatchError) Error() string {
	return fmt.Sprintf("cutover: expected_state_mismatch: expected watermark %s version %d, now watermark %s version %d",
		e.Expected.Watermark.UTC().Format(time.RFC3339), e.Expected.Version, e.Current.Watermark.UTC().Format(time.RFC3339), e.Current.Version)
}

// Unwrap returns ErrExpectedStateMismatch.
func (e *ExpectedStateMismatchError) Unwrap() error { return ErrExpectedStateMismatch }

// ConflictError counts what was already exported on the wrong side of the
// requested watermark. It wraps ErrExportedAcrossWatermark.
type ConflictError struct {
	// Windows: buffered periods at or after the requested watermark with a
	// window staged or acknowledged (they would become recording).
	Windows int `json:"windows"`
	// Events: event and correction items (not quarantined or rejected) for
	// periods before the requested watermark (they would become buffered).
	Events int `json:"events"`
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("cutover: exported_across_watermark: %d window period(s) at or after it, %d event item(s) before it", e.Windows, e.Events)
}

// Unwrap returns ErrExportedAcrossWatermark.
func (e *ConflictError) Unwrap() error { return ErrExportedAcrossWatermark }

// ScheduleInput is a cutover to schedule.
type ScheduleInput struct {
	Tenant  string       // "" = every tenant without a row of its own
	Feature string       // e.g. "api_calls"; required
	At      time.Time    // the watermark; must start a Period
	Actor   string       // who schedules; required (usage_cutovers.scheduled_by)
	Period  usage.Period // the configured usage period; defaults to day
}

func (in ScheduleInput) period() usage.Period {
	if !in.Period.Valid() {
		return usage.PeriodDay
	}
	return in.Period
}

func validateWatermark(feature string, at time.Time, p usage.Period) error {
	switch {
	case strings.TrimSpace(feature) == "":
		return &FieldError{"feature", "must not be empty"}
	case at.IsZero():
		return &FieldError{"at", "must be set"}
	case !p.Start(at).Equal(at):
		return &FieldError{"at", fmt.Sprintf("must start a %s period (UTC), e.g. %s", p, p.Start(at).Format(time.RFC3339))}
	}
	return nil
}

// Validate returns a *FieldError for the first bad field.
func (in ScheduleInput) Validate() error {
	if err := validateWatermark(in.Feature, in.At, in.period()); err != nil {
		return err
	}
	if strings.TrimSpace(in.Actor) == "" {
		return &FieldError{"actor", "must not be empty"}
	}
	return nil
}

// SchedulePlan is what Schedule would do (PlanSchedule) or did.
type SchedulePlan struct {
	Watermark usage.Watermark `json:"watermark"` // the row to insert (version 1)
	// EventsToRequeue: event items quarantined period_buffered for periods
	// at or after the watermark — recorded while their period was buffered,
	// now recording-era: requeue them (auroractl recovery requeue) to send
	// them.
	EventsToRequeue int `json:"events_to_requeue"`
}

// PlanSchedule checks in without writing: *FieldError, *AlreadyScheduledError
// or *ConflictError as Schedule would answer, else the plan.
func PlanSchedule(ctx context.Context, pool *pgxpool.Pool, in ScheduleInput) (SchedulePlan, error) {
	if err := in.Validate(); err != nil {
		return SchedulePlan{}, err
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return SchedulePlan{}, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read-only
	return planSchedule(ctx, tx, in)
}

func planSchedule(ctx context.Context, tx pgx.Tx, in ScheduleInput) (SchedulePlan, error) {
	if err := in.Validate(); err != nil {
		return SchedulePlan{}, err
	}
	at := in.At.UTC()
	if err := usage.LockCutoverExclusive(ctx, tx, in.Feature); err != nil {
		return SchedulePlan{}, err
	}
	if existing, ok, err := usage.WatermarkFor(ctx, tx, in.Tenant, in.Feature); err != nil {
		return SchedulePlan{}, err
	} else if ok && (existing.Tenant == in.Tenant || existing.Tenant == "") {
		return SchedulePlan{}, &AlreadyScheduledError{Existing: existing}
	}
	sc := scopeOf(in.Tenant, in.Feature)
	var c ConflictError
	// Without a watermark every period of the scope was buffered or
	// recorded as a whole: windows at or after at, or exported events
	// before it, would now be on the wrong side.
	if err := sc.count(ctx, tx, windowsIn, &c.Windows, at, farFuture); err != nil {
		return SchedulePlan{}, err
	}
	if err := sc.count(ctx, tx, eventsIn, &c.Events, farPast, at); err != nil {
		return SchedulePlan{}, err
	}
	if c.Windows > 0 || c.Events > 0 {
		return SchedulePlan{}, &c
	}
	plan := SchedulePlan{Watermark: usage.Watermark{Tenant: in.Tenant, Feature: in.Feature, At: at, Version: 1}}
	if err := sc.count(ctx, tx, bufferedEventsIn, &plan.EventsToRequeue, at, farFuture); err != nil {
		return SchedulePlan{}, err
	}
	return plan, nil
}

// Schedule sets the watermark of (in.Tenant, in.Feature), version 1
// (seed 000: mix aurora_meter_pro.cutover --feature … --at … --tenant …).
// Errors: *FieldError (ErrInvalidInput), *AlreadyScheduledError
// (ErrAlreadyScheduled) when a row for the tenant, or the all-tenants row,
// exists, *ConflictError (ErrExportedAcrossWatermark). It never writes the
// source switch (AURORA_FEATURE_SOURCES).
func Schedule(ctx context.Context, pool *pgxpool.Pool, in ScheduleInput) (SchedulePlan, error) {
	var plan SchedulePlan
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		if plan, err = planSchedule(ctx, tx, in); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `
			INSERT INTO usage_cutovers (tenant, feature, watermark, scheduled_by) VALUES ($1, $2, $3, $4)
			ON CONFLICT (tenant, feature) DO NOTHING`, in.Tenant, in.Feature, plan.Watermark.At, in.Actor)
		if err != nil {
			return fmt.Errorf("cutover: schedule: %w", err)
		}
		if tag.RowsAffected() != 1 { // cannot happen under the exclusive lock; never overwrite
			return &AlreadyScheduledError{Existing: plan.Watermark}
		}
		return nil
	})
	if err != nil {
		return SchedulePlan{}, err
	}
	return plan, nil
}

// Status is the cutover status of (tenant, feature) (seed 000,
// Cutover.status: watermark, buffered_periods_open, event_items, drained?).
type Status struct {
	Tenant    string    `json:"tenant"`      // "" = every tenant without a row of its own
	Feature   string    `json:"feature"`     //
	Watermark time.Time `json:"watermark"`   // the governing watermark
	Version   int32     `json:"version"`     // its version
	Governing string    `json:"governed_by"` // "tenant" (the tenant's own row) or "all_tenants"
	// BufferedPeriodsOpen: periods before the watermark whose counter is
	// not fully acknowledged (count above acknowledged_to, or a window
	// still linked).
	BufferedPeriodsOpen int `json:"buffered_periods_open"`
	// EventItems: event and correction items for periods at or after the
	// watermark, in any state.
	EventItems int `json:"event_items"`
	// EventsToRequeue: of those, items quarantined period_buffered (recorded
	// before the watermark was set); requeue them to send them.
	EventsToRequeue int `json:"events_to_requeue"`
	// WatermarkPassed: the database clock is at or past the watermark, so
	// no buffered period can still receive usage in real time.
	WatermarkPassed bool `json:"watermark_passed"`
	// Drained: WatermarkPassed and BufferedPeriodsOpen == 0. Only then
	// deploy AURORA_FEATURE_SOURCES=<feature>:events.
	Drained bool `json:"drained"`
	// Now is the database clock reading the status was taken at.
	Now time.Time `json:"now"`
}

// StatusOf returns the status of the cutover that governs (tenant,
// feature); tenant "" covers the tenants without a row of their own. clk
// overrides the database clock (nil = now()). ErrNotScheduled when no
// cutover governs it.
func StatusOf(ctx context.Context, q outbox.Querier, tenant, feature string, clk clock.Clock) (Status, error) {
	if strings.TrimSpace(feature) == "" {
		return Status{}, &FieldError{"feature", "must not be empty"}
	}
	w, ok, err := usage.WatermarkFor(ctx, q, tenant, feature)
	if err != nil {
		return Status{}, err
	}
	if !ok {
		return Status{}, fmt.Errorf("%w: no cutover for %s", ErrNotScheduled, feature)
	}
	st := Status{Tenant: tenant, Feature: feature, Watermark: w.At, Version: w.Version, Governing: "all_tenants"}
	if w.Tenant != "" {
		st.Governing = "tenant"
	}
	sc := scopeOf(tenant, feature)
	if err := sc.count(ctx, q, openPeriodsBefore, &st.BufferedPeriodsOpen, farPast, w.At); err != nil {
		return Status{}, err
	}
	if err := sc.count(ctx, q, allEventsIn, &st.EventItems, w.At, farFuture); err != nil {
		return Status{}, err
	}
	if err := sc.count(ctx, q, bufferedEventsIn, &st.EventsToRequeue, w.At, farFuture); err != nil {
		return Status{}, err
	}
	if err := q.QueryRow(ctx, `SELECT coalesce($1::timestamptz, now()), coalesce($1::timestamptz, now()) >= $2`,
		clock.Or(clk).Override(), w.At).Scan(&st.Now, &st.WatermarkPassed); err != nil {
		return Status{}, fmt.Errorf("cutover: status: clock: %w", err)
	}
	st.Now = st.Now.UTC()
	st.Drained = st.WatermarkPassed && st.BufferedPeriodsOpen == 0
	return st, nil
}

var (
	farPast   = time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)
	farFuture = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)
)

// The counting queries, each over a tenant scope and a period range
// [$lo, $hi). $1 = feature, $2 = tenant (” = tenants without their own
// row), $3 = lo, $4 = hi; alias x is the scoped table.
const (
	windowsIn = `SELECT count(*) FROM usage_windows x WHERE x.feature = $1 AND %s
		AND x.period_start >= $3 AND x.period_start < $4 AND (x.acknowledged_to > 0 OR x.staged_item_id IS NOT NULL)`
	eventsIn = `SELECT count(*) FROM outbox_items x WHERE x.feature = $1 AND %s
		AND x.subject_kind IN ('event', 'correction') AND x.period_start >= $3 AND x.period_start < $4
		AND x.state NOT IN ('quarantined', 'rejected')`
	allEventsIn = `SELECT count(*) FROM outbox_items x WHERE x.feature = $1 AND %s
		AND x.subject_kind IN ('event', 'correction') AND x.period_start >= $3 AND x.period_start < $4`
	bufferedEventsIn = `SELECT count(*) FROM outbox_items x WHERE x.feature = $1 AND %s
		AND x.subject_kind IN ('event', 'correction') AND x.period_start >= $3 AND x.period_start < $4
		AND x.state = 'quarantined' AND x.quarantine_reason = 'period_buffered'`
	openPeriodsBefore = `SELECT count(*) FROM usage_counters x
		LEFT JOIN usage_windows w USING (tenant, feature, period_start)
		WHERE x.feature = $1 AND %s AND x.period_start >= $3 AND x.period_start < $4
		AND (x.count > coalesce(w.acknowledged_to, 0) OR w.staged_item_id IS NOT NULL)`
)

type scope struct{ tenant, feature string }

func scopeOf(tenant, feature string) scope { return scope{tenant, feature} }

func (s scope) count(ctx context.Context, q outbox.Querier, query string, dst *int, lo, hi time.Time) error {
	cond := `x.tenant = $2`
	if s.tenant == "" {
		cond = `$2 = '' AND x.tenant NOT IN (SELECT tenant FROM usage_cutovers WHERE feature = $1 AND tenant <> '')`
	}
	if err := q.QueryRow(ctx, fmt.Sprintf(query, cond), s.feature, s.tenant, lo, hi).Scan(dst); err != nil {
		return fmt.Errorf("cutover: count: %w", err)
	}
	return nil
}

// RescheduleInput moves a watermark: a recovery action (seed 000,
// Recovery.reschedule_cutover/2) with the expected state the operator read,
// a reason and evidence.
type RescheduleInput struct {
	Tenant   string       // "" = the all-tenants row
	Feature  string       // required
	At       time.Time    // the new watermark; must start a Period
	Expected Expected     // the watermark and version the operator read
	Reason   string       // why; required
	Evidence string       // what shows it is right; required
	Actor    string       // who; required
	Period   usage.Period // the configured usage period; defaults to day
}

// Validate returns a *FieldError for the first bad field.
func (in RescheduleInput) Validate() error {
	p := in.Period
	if !p.Valid() {
		p = usage.PeriodDay
	}
	if err := validateWatermark(in.Feature, in.At, p); err != nil {
		return err
	}
	switch {
	case in.Expected.Watermark.IsZero():
		return &FieldError{"expected.watermark", "must be set (the watermark you read)"}
	case in.Expected.Version < 1:
		return &FieldError{"expected.version", "must be >= 1 (the version you read)"}
	case strings.TrimSpace(in.Reason) == "":
		return &FieldError{"reason", "must not be blank"}
	case strings.TrimSpace(in.Evidence) == "":
		return &FieldError{"evidence", "must not be blank"}
	case strings.TrimSpace(in.Actor) == "":
		return &FieldError{"actor", "must not be blank"}
	}
	return nil
}

// ActionReschedule is recovery_actions.action of a reschedule.
const ActionReschedule = "reschedule_cutover"

// Refusal atoms stored in recovery_actions.refusal.
const (
	RefusalNotScheduled            = "not_scheduled"
	RefusalExpectedStateMismatch   = "expected_state_mismatch"
	RefusalExportedAcrossWatermark = "exported_across_watermark"
)

// RescheduleResult is what Reschedule did (or would do: PlanReschedule).
type RescheduleResult struct {
	Before usage.Watermark `json:"before"`
	After  usage.Watermark `json:"after"`
	// EventsToRequeue: event items quarantined period_buffered for periods
	// that become recording-era (moving earlier): requeue them.
	EventsToRequeue int `json:"events_to_requeue"`
	// ActionID is the recovery_actions row (0 in a plan).
	ActionID int64 `json:"action_id"`
}

// Reschedule moves the watermark of exactly (in.Tenant, in.Feature) to
// in.At when it still is in.Expected, bumping the version. Every call that
// passes validation writes one recovery_actions row (action
// reschedule_cutover, subject {tenant, feature}, expected, observed,
// applied or refused) in the same transaction, and refusals commit that
// row. Errors: *FieldError (ErrInvalidInput; nothing recorded),
// ErrNotScheduled, *ExpectedStateMismatchError (ErrExpectedStateMismatch),
// *ConflictError (ErrExportedAcrossWatermark) — each recorded as refused.
// There is no force option.
func Reschedule(ctx context.Context, pool *pgxpool.Pool, in RescheduleInput) (RescheduleResult, error) {
	if err := in.Validate(); err != nil {
		return RescheduleResult{}, err
	}
	var res RescheduleResult
	var refusal error
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var current *usage.Watermark
		var err error
		res, current, refusal, err = planReschedule(ctx, tx, in)
		if err != nil {
			return err
		}
		if refusal == nil {
			if _, err := tx.Exec(ctx, `
				UPDATE usage_cutovers SET watermark = $3, version = version + 1, updated_at = now()
				WHERE tenant = $1 AND feature = $2`, in.Tenant, in.Feature, res.After.At); err != nil {
				return fmt.Errorf("cutover: reschedule: %w", err)
			}
		}
		res.ActionID, err = recordAction(ctx, tx, in, current, refusal)
		return err
	})
	if err != nil {
		return RescheduleResult{}, err
	}
	if refusal != nil {
		return res, refusal
	}
	return res, nil
}

// PlanReschedule answers as Reschedule would, writing nothing (no action
// row: nothing was asked of the system yet).
func PlanReschedule(ctx context.Context, pool *pgxpool.Pool, in RescheduleInput) (RescheduleResult, error) {
	if err := in.Validate(); err != nil {
		return RescheduleResult{}, err
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return RescheduleResult{}, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read-only
	res, _, refusal, err := planReschedule(ctx, tx, in)
	if err != nil {
		return RescheduleResult{}, err
	}
	return res, refusal
}

func planReschedule(ctx context.Context, tx pgx.Tx, in RescheduleInput) (res RescheduleResult, current *usage.Watermark, refusal, err error) {
	if err := usage.LockCutoverExclusive(ctx, tx, in.Feature); err != nil {
		return res, nil, nil, err
	}
	var w usage.Watermark
	err = tx.QueryRow(ctx, `SELECT tenant, feature, watermark, version FROM usage_cutovers WHERE tenant = $1 AND feature = $2 FOR UPDATE`,
		in.Tenant, in.Feature).Scan(&w.Tenant, &w.Feature, &w.At, &w.Version)
	if errors.Is(err, pgx.ErrNoRows) {
		return res, nil, fmt.Errorf("%w: no cutover row for this tenant and %s (a tenant governed by the all-tenants row is rescheduled with it)", ErrNotScheduled, in.Feature), nil
	}
	if err != nil {
		return res, nil, nil, fmt.Errorf("cutover: reschedule: read: %w", err)
	}
	w.At = w.At.UTC()
	current = &w
	res.Before = w
	res.After = usage.Watermark{Tenant: w.Tenant, Feature: w.Feature, At: in.At.UTC(), Version: w.Version + 1}
	if !w.At.Equal(in.Expected.Watermark) || w.Version != in.Expected.Version {
		return res, current, &ExpectedStateMismatchError{Expected: in.Expected, Current: Expected{Watermark: w.At, Version: w.Version}}, nil
	}
	sc := scopeOf(in.Tenant, in.Feature)
	var c ConflictError
	switch newAt := res.After.At; {
	case newAt.After(w.At): // [w, new) becomes buffered: events exported there conflict
		if err := sc.count(ctx, tx, eventsIn, &c.Events, w.At, newAt); err != nil {
			return res, current, nil, err
		}
	case newAt.Before(w.At): // [new, w) becomes recording: windows there conflict
		if err := sc.count(ctx, tx, windowsIn, &c.Windows, newAt, w.At); err != nil {
			return res, current, nil, err
		}
		if err := sc.count(ctx, tx, bufferedEventsIn, &res.EventsToRequeue, newAt, w.At); err != nil {
			return res, current, nil, err
		}
	}
	if c.Windows > 0 || c.Events > 0 {
		return res, current, &c, nil
	}
	return res, current, nil, nil
}

func recordAction(ctx context.Context, tx pgx.Tx, in RescheduleInput, current *usage.Watermark, refusal error) (int64, error) {
	expected, _ := json.Marshal(map[string]any{
		"watermark": in.Expected.Watermark.UTC(), "version": in.Expected.Version, "requested_watermark": in.At.UTC(),
	})
	obs := map[string]any{}
	if current != nil {
		obs["watermark"], obs["version"] = current.At, current.Version
	}
	var ce *ConflictError
	if errors.As(refusal, &ce) {
		obs["windows_in_range"], obs["events_in_range"] = ce.Windows, ce.Events
	}
	observed, _ := json.Marshal(obs)
	subject, _ := json.Marshal(map[string]string{"tenant": in.Tenant, "feature": in.Feature})
	var refusalAtom *string
	switch {
	case refusal == nil:
	case errors.Is(refusal, ErrNotScheduled):
		s := RefusalNotScheduled
		refusalAtom = &s
	case errors.Is(refusal, ErrExpectedStateMismatch):
		s := RefusalExpectedStateMismatch
		refusalAtom = &s
	case errors.Is(refusal, ErrExportedAcrossWatermark):
		s := RefusalExportedAcrossWatermark
		refusalAtom = &s
	default:
		return 0, fmt.Errorf("cutover: unknown refusal %w", refusal)
	}
	var id int64
	err := tx.QueryRow(ctx, `
		INSERT INTO recovery_actions (item_id, action, actor, reason, evidence, expected, observed, applied, refusal, subject)
		VALUES (NULL, $1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING id`,
		ActionReschedule, in.Actor, in.Reason, in.Evidence, expected, observed, refusal == nil, refusalAtom, subject).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("cutover: record action: %w", err)
	}
	return id, nil
}
