// Package usage records usage facts in the caller's transaction: durable
// usage events (the recording era), each staged as its own export item, and
// buffered counters per (tenant, feature, period) (the buffered era, whose
// windows the buffered reporter stages). Seed 000, "Identity…" and
// "Durable events and corrections".
//
// # The staging path
//
// Gate.Record, Gate.RecordBatch and Recorder.Record are one path (path.stage
// in batch.go): Record is a batch of one event, and every rule below is
// written once, so a rule cannot reach one entry point and miss another.
// For a batch, in this order:
//
//  1. Validate: every event passes Event.Validate (*FieldError,
//     ErrInvalidEvent), before anything is read or written.
//  2. Look up, in one round trip (Gate only for the first two): the shared
//     cutover lock of every feature of the batch, in a stable order
//     (LockCutoverShared); the watermarks governing its (tenant, feature)
//     pairs, read under those locks; the mapping version of each feature on
//     the destination account (0 when unmapped).
//  3. Decide each event's item: period (Recorder.Period), mapping version,
//     era (EraOf; Gate only: buffered → outbox.WithQuarantine
//     period_buffered; Recorder.Record: the caller's options), then
//     outbox.Prepare, the rules of outbox.Stage (*outbox.FieldError).
//  4. Write the plain events (not corrections) in one statement: each new
//     event with its item, linked; an event already recorded is a repeat
//     (same content: its item, not created) or ErrEventConflict; an event
//     whose item identity already exists goes through outbox.Stage (which
//     collapses onto it or returns outbox.ErrPayloadConflict) and is linked
//     to it.
//  5. Then each correction in order: CheckCorrection (Gate only), and the
//     write of step 4 for it alone. Corrections come after the plain events
//     so a correction may name an event of the same batch.
//
// The first refused event ends the call (RecordBatch: *EventError naming
// its index and id, wrapping the refusal; Record: the refusal itself) and
// tx holds a partial write: the caller rolls back. To record the rest the
// caller records them again without it (the demo and `aurora usage import`
// replay a refused batch one event per transaction, and report each
// refused event with its line).
package usage

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aurora-billing/aurora/shared/field"
	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/jackc/pgx/v5"
)

// Period is the length of a usage period.
type Period string

const (
	PeriodHour  Period = "hour"  // periods start on the UTC hour
	PeriodDay   Period = "day"   // periods start at UTC midnight
	PeriodMonth Period = "month" // periods start on the first of the UTC month
)

// Start returns the start (UTC) of the period that contains t.
func (p Period) Start(t time.Time) time.Time {
	t = t.UTC()
	switch p {
	case PeriodHour:
		return t.Truncate(time.Hour)
	case PeriodMonth:
		return time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
	case PeriodDay:
		return time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
	default:
		return time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
	}
}

// Valid reports whether p is hour, day or month.
func (p Period) Valid() bool { return p == PeriodHour || p == PeriodDay || p == PeriodMonth }

var (
	// ErrInvalidEvent: an event failed validation; see *FieldError.
	ErrInvalidEvent = errors.New("usage: invalid event")
	// ErrEventConflict: (tenant, event_id) was already recorded with
	// different content. Nothing was written.
	ErrEventConflict = errors.New("usage: event_conflict")
)

// FieldError names the invalid field of an Event. It wraps ErrInvalidEvent.
type FieldError struct{ Field, Reason string }

func (e *FieldError) Error() string { return "usage: invalid " + e.Field + ": " + e.Reason }

// Unwrap returns ErrInvalidEvent.
func (e *FieldError) Unwrap() error { return ErrInvalidEvent }

// Event is one durable usage fact. A correction names the event it corrects
// in CorrectsEventID and carries the signed quantity to add (negative to
// remove usage).
type Event struct {
	Tenant          string    // e.g. "org_123"
	EventID         string    // unique per tenant; the idempotency of recording
	Feature         string    // e.g. "api_calls"
	Quantity        int64     // units of the feature
	OccurredAt      time.Time // when the usage happened; becomes the meter event timestamp
	CorrectsEventID string    // non-empty makes this a correction
}

// Kind returns event or correction.
func (e Event) Kind() identity.SubjectKind {
	if e.CorrectsEventID != "" {
		return identity.SubjectCorrection
	}
	return identity.SubjectEvent
}

// Validate returns a *FieldError for the first bad field, checked with
// package field's rules: tenant and event_id are text of at most
// field.MaxTenantBytes / field.MaxEventIDBytes (valid UTF-8, no NUL or
// control characters), feature a feature name (field.Feature), the
// quantity within 15 significant digits (field.MaxQuantity) and ≥ 0 for an
// event, occurred_at set and in the years 1970..9999 UTC, corrects_event_id
// text like event_id and not the event itself.
func (e Event) Validate() error {
	if r := field.Text(e.Tenant, field.MaxTenantBytes); r != "" {
		return &FieldError{"tenant", r}
	}
	if r := field.Text(e.EventID, field.MaxEventIDBytes); r != "" {
		return &FieldError{"event_id", r}
	}
	if r := field.Feature(e.Feature); r != "" {
		return &FieldError{"feature", r}
	}
	if e.OccurredAt.IsZero() {
		return &FieldError{"occurred_at", "must be set"}
	}
	if y := e.OccurredAt.UTC().Year(); y < 1970 || y > 9999 {
		// a meter event timestamp is Unix seconds; a year before 1970 (RFC
		// 3339 allows 0000, and an offset moves it to 1 BC) is no usage time
		// (found by FuzzJSONL)
		return &FieldError{"occurred_at", "must be between 1970-01-01 and 9999-12-31 UTC"}
	}
	if e.CorrectsEventID == "" && e.Quantity < 0 {
		return &FieldError{"quantity", "must be >= 0 for an event (use a correction to remove usage)"}
	}
	if r := field.Quantity(e.Quantity, true); r != "" {
		return &FieldError{"quantity", r}
	}
	if e.CorrectsEventID != "" {
		if r := field.Text(e.CorrectsEventID, field.MaxEventIDBytes); r != "" {
			return &FieldError{"corrects_event_id", r}
		}
		if e.CorrectsEventID == e.EventID {
			return &FieldError{"corrects_event_id", "an event cannot correct itself"}
		}
	}
	return nil
}

// Recorder records usage for one destination.
type Recorder struct {
	Exporter           string        // default outbox.DefaultExporter
	DestinationAccount string        // Stripe account the items go to
	Mode               identity.Mode // test | live
	Period             Period        // default day
}

func (r Recorder) exporter() string {
	if r.Exporter == "" {
		return outbox.DefaultExporter
	}
	return r.Exporter
}

func (r Recorder) period() Period {
	if !r.Period.Valid() {
		return PeriodDay
	}
	return r.Period
}

// SubjectRef returns the subject_ref of an event's export item:
// "event:<event_id>" or "correction:<event_id>".
func SubjectRef(e Event) string { return string(e.Kind()) + ":" + e.EventID }

// Record stores ev durably in tx, idempotently by (tenant, event_id), and
// stages its export item in the same transaction, on the staging path
// without the cutover and correction steps (package documentation: steps
// 1, 3 and 4; use Gate to apply them). Recording the same event again
// returns the item staged the first time and created=false; the same event
// id with different content returns ErrEventConflict and writes nothing.
// The item's mapping_version is the feature's current mapping version on
// the destination account (0 when the feature is not mapped yet; the
// deliverer then quarantines it feature_unmapped).
//
// opts apply to the item as in outbox.Stage (e.g. outbox.WithQuarantine for
// an event in a buffered period).
func (r Recorder) Record(ctx context.Context, tx pgx.Tx, ev Event, opts ...outbox.StageOption) (row outbox.Row, created bool, err error) {
	return recordOne(ctx, tx, path{r: r, opts: opts}, ev)
}

// recordOne runs ev alone through p and returns its item as stored and
// the refusal unwrapped (not an *EventError).
func recordOne(ctx context.Context, tx pgx.Tx, p path, ev Event) (outbox.Row, bool, error) {
	res, err := p.stage(ctx, tx, []Event{ev})
	if err != nil {
		var ee *EventError
		if errors.As(err, &ee) {
			return outbox.Row{}, false, ee.Err
		}
		return outbox.Row{}, false, err
	}
	row, err := outbox.Get(ctx, tx, res[0].item)
	if err != nil {
		return outbox.Row{}, false, fmt.Errorf("usage: record: %w", err)
	}
	return row, res[0].created, nil
}

// linkItem records in tx that the usage event ev is billed by item itemID.
func linkItem(ctx context.Context, tx pgx.Tx, ev Event, itemID int64) error {
	if _, err := tx.Exec(ctx, `UPDATE usage_events SET item_id = $3 WHERE tenant = $1 AND event_id = $2`, ev.Tenant, ev.EventID, itemID); err != nil {
		return fmt.Errorf("link item: %w", err)
	}
	return nil
}

// Increment adds n (0 ≤ n ≤ field.MaxQuantity) to the buffered counter of (tenant, feature, the
// period containing at) in tx and returns the new count.
func (r Recorder) Increment(ctx context.Context, tx pgx.Tx, tenant, feature string, at time.Time, n int64) (int64, error) {
	if r := field.Text(tenant, field.MaxTenantBytes); r != "" {
		return 0, &FieldError{"tenant", r}
	}
	if r := field.Feature(feature); r != "" {
		return 0, &FieldError{"feature", r}
	}
	if r := field.Quantity(n, false); r != "" {
		return 0, &FieldError{"quantity", r}
	}
	if at.IsZero() {
		return 0, &FieldError{"occurred_at", "must be set"}
	}
	var count int64
	err := tx.QueryRow(ctx, `
		INSERT INTO usage_counters (tenant, feature, period_start, count) VALUES ($1, $2, $3, $4)
		ON CONFLICT (tenant, feature, period_start) DO UPDATE SET count = usage_counters.count + EXCLUDED.count, updated_at = now()
		RETURNING count`, tenant, feature, r.period().Start(at), n).Scan(&count)
	if err != nil {
		return 0, fmt.Errorf("usage: increment: %w", err)
	}
	return count, nil
}
