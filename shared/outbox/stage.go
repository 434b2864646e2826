package outbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// StageOption adjusts how Stage writes a new row.
type StageOption func(*stageOptions)

type stageOptions struct {
	quarantine *Reason
}

// WithQuarantine stages a new row directly as quarantined with reason (the
// "(new) → quarantined" transition, e.g. period_buffered at stage time). It
// has no effect when the identity already exists.
func WithQuarantine(reason Reason) StageOption {
	return func(o *stageOptions) { o.quarantine = &reason }
}

// Prepared is an item checked and completed by the rules of staging, ready
// to be written: Item with PeriodStart and Payload filled in (the defaults
// below), and the state and quarantine reason of the new row.
type Prepared struct {
	Item
	State  State   // StatePending, or StateQuarantined (WithQuarantine)
	Reason *string // the quarantine reason; nil when pending
}

// Prepare applies the rules of staging to it and opts, the one place they
// are written (Stage, and every set insert of items such as
// usage.Gate.RecordBatch, write only what Prepare returns): it validates it
// (Item.Validate: *FieldError, ErrInvalidItem) and the quarantine reason
// (*FieldError quarantine_reason), defaults PeriodStart to OccurredAt's UTC
// day and Payload to {}, and sets the state (pending, or quarantined with
// WithQuarantine's reason).
func Prepare(it Item, opts ...StageOption) (Prepared, error) {
	if err := it.Validate(); err != nil {
		return Prepared{}, err
	}
	var o stageOptions
	for _, fn := range opts {
		fn(&o)
	}
	p := Prepared{Item: it, State: StatePending}
	if o.quarantine != nil {
		if !o.quarantine.Valid() {
			return Prepared{}, &FieldError{Field: "quarantine_reason", Reason: fmt.Sprintf("unknown reason %q", string(*o.quarantine))}
		}
		r := string(*o.quarantine)
		p.State, p.Reason = StateQuarantined, &r
	}
	p.Payload = it.payloadOrEmpty()
	p.PeriodStart = it.periodStart()
	p.OccurredAt = it.OccurredAt.UTC()
	return p, nil
}

// Stage writes the export intent in the caller's transaction tx and
// returns the stored row, so the intent commits or rolls back with the fact
// it exports (seed 000, "Why a row first").
//
// The same identity collapses onto the existing row and returns it (no
// second row, no error), also under concurrency: ON CONFLICT DO NOTHING waits
// for a concurrent inserter and then reads its row. The same identity with a
// different payload (feature, quantity, occurred_at, period_start or payload
// object) returns *PayloadConflictError (ErrPayloadConflict) and writes
// nothing. Invalid input returns *FieldError (ErrInvalidItem) naming the
// field (see Prepare).
func Stage(ctx context.Context, tx pgx.Tx, it Item, opts ...StageOption) (Row, error) {
	p, err := Prepare(it, opts...)
	if err != nil {
		return Row{}, err
	}
	it = p.Item
	payload, periodStart, state, reason := []byte(it.Payload), it.PeriodStart, p.State, p.Reason
	row, err := ScanRow(tx.QueryRow(ctx, `
		INSERT INTO outbox_items (tenant, subject_kind, subject_ref, exporter, destination_account, mode,
			mapping_version, idempotency_key, feature, quantity, occurred_at, period_start, payload, state, quarantine_reason)
		VALUES ($1, $2, $3, $4, $5, $6, $7, '', $8, $9, $10, $11, $12, $13, $14)
		ON CONFLICT ON CONSTRAINT outbox_items_identity_key DO NOTHING
		RETURNING `+Columns,
		it.Tenant, string(it.SubjectKind), it.SubjectRef, it.Exporter, it.DestinationAccount, string(it.Mode),
		it.MappingVersion, it.Feature, it.Quantity, it.OccurredAt.UTC(), periodStart, payload, string(state), reason))
	if err == nil {
		return row, nil
	}
	if err != pgx.ErrNoRows {
		return Row{}, fmt.Errorf("outbox: stage: %w", err)
	}
	// The identity exists (committed, or committed by a concurrent stager we
	// waited for). Compare the payload in SQL so jsonb equality is semantic.
	var same bool
	row, err = ScanRowWith(tx.QueryRow(ctx, `
		SELECT `+Columns+`,
			(feature = $8 AND quantity = $9 AND occurred_at = $10 AND period_start = $11 AND payload = $12::jsonb)
		FROM outbox_items
		WHERE idempotency_key = aurora_idempotency_key($1, $2, $3, $5) -- the identity's index (migration 00012)
		  AND tenant = $1 AND subject_kind = $2 AND subject_ref = $3 AND exporter = $4
		  AND destination_account = $5 AND mode = $6 AND mapping_version = $7`,
		it.Tenant, string(it.SubjectKind), it.SubjectRef, it.Exporter, it.DestinationAccount, string(it.Mode),
		it.MappingVersion, it.Feature, it.Quantity, it.OccurredAt.UTC(), periodStart, payload), &same)
	if err != nil {
		return Row{}, fmt.Errorf("outbox: stage: read existing: %w", err)
	}
	if !same {
		return Row{}, &PayloadConflictError{ExistingID: row.ID}
	}
	return row, nil
}

// ScanRowWith scans Columns followed by extra destinations.
func ScanRowWith(r pgx.Row, extra ...any) (Row, error) {
	var captured Row
	var err error
	wrapped := rowFunc(func(dest ...any) error {
		return r.Scan(append(dest, extra...)...)
	})
	captured, err = ScanRow(wrapped)
	return captured, err
}

type rowFunc func(dest ...any) error

func (f rowFunc) Scan(dest ...any) error { return f(dest...) }
