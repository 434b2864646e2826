package usage

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/jackc/pgx/v5"
)

// End returns the end (exclusive, UTC) of the period that starts at start.
func (p Period) End(start time.Time) time.Time {
	start = p.Start(start)
	switch p {
	case PeriodHour:
		return start.Add(time.Hour)
	case PeriodMonth:
		return start.AddDate(0, 1, 0)
	case PeriodDay:
		return start.AddDate(0, 0, 1)
	default:
		return start.AddDate(0, 0, 1)
	}
}

// Watermark is the cutover of (tenant, feature) as stored in usage_cutovers.
// Tenant "" is the row that applies to every tenant without a row of its
// own.
type Watermark struct {
	Tenant  string    `json:"tenant"`  // "" = all tenants without their own row
	Feature string    `json:"feature"` // e.g. "api_calls"
	At      time.Time `json:"at"`      // periods starting before it are buffered; on or after it, recorded
	Version int32     `json:"version"` // 1 when scheduled; +1 on every reschedule
}

// WatermarkFor returns the watermark that governs (tenant, feature): the
// tenant's own row, else the all-tenants row (tenant ""). ok is false when
// neither exists. It does not lock; call LockCutoverShared first in the same
// transaction when the answer decides a write.
func WatermarkFor(ctx context.Context, q outbox.Querier, tenant, feature string) (w Watermark, ok bool, err error) {
	return scanWatermark(q.QueryRow(ctx, watermarkSQL, tenant, feature))
}

// scanWatermark reads one watermarkSQL row; no row is ok == false.
func scanWatermark(row pgx.Row) (w Watermark, ok bool, err error) {
	err = row.Scan(&w.Tenant, &w.Feature, &w.At, &w.Version)
	if errors.Is(err, pgx.ErrNoRows) {
		return Watermark{}, false, nil
	}
	if err != nil {
		return Watermark{}, false, fmt.Errorf("usage: watermark: %w", err)
	}
	w.At = w.At.UTC()
	return w, true, nil
}

const watermarkSQL = `
	SELECT tenant, feature, watermark, version FROM usage_cutovers
	WHERE feature = $2 AND tenant IN ($1, '')
	ORDER BY tenant = '' LIMIT 1`

// cutoverLockKey is the advisory-lock key of a feature's cutover. One key
// per feature (not per tenant) because the all-tenants row governs every
// tenant.
const cutoverLockKey = `hashtextextended('aurora.usage_cutover:' || $1, 0)`

// LockCutoverShared takes a transaction-scoped shared advisory lock on
// feature's cutover. Writers whose decision depends on the watermark (the
// buffered reporter staging a window, Gate.Record staging an event) take it
// before reading the watermark, so a schedule or reschedule (which takes the
// exclusive lock) cannot change the watermark between their read and their
// commit.
func LockCutoverShared(ctx context.Context, tx pgx.Tx, feature string) error {
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock_shared(`+cutoverLockKey+`)`, feature); err != nil {
		return fmt.Errorf("usage: lock cutover %s: %w", feature, err)
	}
	return nil
}

// LockedWatermarkFor takes the shared cutover lock of feature and then reads
// the watermark governing (tenant, feature), pipelined in one round trip
// (the statements still run in order, the read after the lock is granted,
// each with its own snapshot). See LockCutoverShared and WatermarkFor.
func LockedWatermarkFor(ctx context.Context, tx pgx.Tx, tenant, feature string) (w Watermark, ok bool, err error) {
	b := &pgx.Batch{}
	b.Queue(`SELECT pg_advisory_xact_lock_shared(`+cutoverLockKey+`)`, feature)
	b.Queue(watermarkSQL, tenant, feature)
	br := tx.SendBatch(ctx, b)
	defer func() {
		if cerr := br.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("usage: watermark: %w", cerr)
		}
	}()
	if _, err := br.Exec(); err != nil {
		return Watermark{}, false, fmt.Errorf("usage: lock cutover %s: %w", feature, err)
	}
	return scanWatermark(br.QueryRow())
}

// LockCutoverExclusive takes the transaction-scoped exclusive advisory lock
// on feature's cutover (schedule, reschedule).
func LockCutoverExclusive(ctx context.Context, tx pgx.Tx, feature string) error {
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(`+cutoverLockKey+`)`, feature); err != nil {
		return fmt.Errorf("usage: lock cutover %s: %w", feature, err)
	}
	return nil
}

// Era says which side exports a period of a feature.
type Era string

const (
	// EraBuffered: counters and the buffered reporter's windows export the
	// period; an event for it is quarantined period_buffered.
	EraBuffered Era = "buffered"
	// EraRecording: durable events export the period; the buffered reporter
	// stages no window for it.
	EraRecording Era = "recording"
)

// EraOf decides which side exports the period starting at periodStart
// (seed 000, "Cutting a feature over"): with a watermark, periods starting
// before it are buffered and periods starting on or after it are recorded,
// whatever the source says, so the split is exclusive. Without a watermark
// the feature's configured source decides alone: counters → buffered,
// events → recording.
func EraOf(periodStart time.Time, w Watermark, scheduled bool, src Source) Era {
	if scheduled {
		if periodStart.Before(w.At) {
			return EraBuffered
		}
		return EraRecording
	}
	if src == SourceEvents {
		return EraRecording
	}
	return EraBuffered
}

// Gate records durable usage through the cutover watermark: an event (or
// correction) whose period belongs to the buffered era is stored and staged
// directly as quarantined period_buffered (the "(new) → quarantined"
// transition), so it is visible and never sent; the counters bill that
// period. Everything else is staged pending as by Recorder.Record.
type Gate struct {
	Recorder Recorder
	Sources  Sources // AURORA_FEATURE_SOURCES; nil = every feature counts
}

// Record records ev on the staging path (package documentation, steps 1
// to 5): it validates ev (*FieldError, ErrInvalidEvent), takes the shared
// cutover lock of ev.Feature and reads its watermark, stages the item
// quarantined period_buffered when EraOf says the period is buffered,
// checks a correction against the record it corrects (CheckCorrection:
// ErrCorrectedUnknown, ErrCorrectionExceeds, *AlreadyCancelledError), and
// stores ev and its item as Recorder.Record documents (created,
// ErrEventConflict, outbox.ErrPayloadConflict). It is RecordBatch of one
// event, with the refusal returned unwrapped.
func (g Gate) Record(ctx context.Context, tx pgx.Tx, ev Event) (row outbox.Row, created bool, err error) {
	return recordOne(ctx, tx, g.path(), ev)
}
