package usage

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The SQLSTATEs of the SQL API (the record_usage_sql_api migration: aurora.record_usage and
// aurora.record_usage_correction), one per refusal. Each names the Go error
// the same input gets from Gate.Record; FromSQL maps them back.
const (
	SQLStateInvalidEvent      = "AU001" // *FieldError (ErrInvalidEvent); the error's COLUMN names the field
	SQLStateEventConflict     = "AU002" // ErrEventConflict
	SQLStateCorrectedUnknown  = "AU003" // ErrCorrectedUnknown
	SQLStateCorrectionExceeds = "AU004" // ErrCorrectionExceeds
	SQLStateAlreadyCancelled  = "AU005" // *AlreadyCancelledError (ErrAlreadyCancelled); DETAIL "cancelled_by=<event id>"
	SQLStateInvalidItem       = "AU006" // *outbox.FieldError (outbox.ErrInvalidItem); COLUMN names the field
	SQLStatePayloadConflict   = "AU007" // outbox.ErrPayloadConflict
	SQLStateNotConfigured     = "AU010" // ErrNotConfigured
)

// ErrNotConfigured: the SQL API has no recording settings
// (aurora.recording_settings is empty); `auroractl usage configure` writes
// them.
var ErrNotConfigured = errors.New("usage: recording_not_configured")

// FromSQL returns the Go error of a refusal raised by the SQL API: err
// wrapped with the sentinel or typed error Gate.Record returns for the same
// input (a *FieldError, ErrEventConflict, ErrCorrectedUnknown,
// ErrCorrectionExceeds, *AlreadyCancelledError, *outbox.FieldError,
// *outbox.PayloadConflictError, ErrNotConfigured). Any other error is
// returned as it is.
func FromSQL(err error) error {
	var pg *pgconn.PgError
	if !errors.As(err, &pg) {
		return err
	}
	switch pg.Code {
	case SQLStateInvalidEvent:
		return fmt.Errorf("%w: %w", &FieldError{Field: pg.ColumnName, Reason: reasonOf(pg.Message)}, err)
	case SQLStateEventConflict:
		return fmt.Errorf("%w: %w", ErrEventConflict, err)
	case SQLStateCorrectedUnknown:
		return fmt.Errorf("%w: %w", ErrCorrectedUnknown, err)
	case SQLStateCorrectionExceeds:
		return fmt.Errorf("%w: %w", ErrCorrectionExceeds, err)
	case SQLStateAlreadyCancelled:
		return fmt.Errorf("%w: %w", &AlreadyCancelledError{CancelledBy: strings.TrimPrefix(pg.Detail, "cancelled_by=")}, err)
	case SQLStateInvalidItem:
		return fmt.Errorf("%w: %w", &outbox.FieldError{Field: pg.ColumnName, Reason: reasonOf(pg.Message)}, err)
	case SQLStatePayloadConflict:
		return fmt.Errorf("%w: %w", &outbox.PayloadConflictError{}, err)
	case SQLStateNotConfigured:
		return fmt.Errorf("%w: %w", ErrNotConfigured, err)
	}
	return err
}

// reasonOf returns what follows "<prefix>: invalid <field>: " in msg.
func reasonOf(msg string) string {
	if i := strings.Index(msg, ": invalid "); i >= 0 {
		if _, reason, ok := strings.Cut(msg[i+len(": invalid "):], ": "); ok {
			return reason
		}
	}
	return msg
}

// SQLResult is one row of aurora.record_usage.
type SQLResult struct {
	ItemID           int64
	IdempotencyKey   string
	State            outbox.State
	QuarantineReason *string
	Created          bool
}

// RecordSQL records ev in tx through the SQL API (aurora.record_usage, or
// aurora.record_usage_correction when ev is a correction), as an
// application in another language would, and maps a refusal with FromSQL.
// A refusal aborts tx (Postgres semantics); RecordSQL runs the call inside
// a savepoint so tx stays usable after a refusal.
func RecordSQL(ctx context.Context, tx pgx.Tx, ev Event) (SQLResult, error) {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return SQLResult{}, err
	}
	defer sp.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	var occurred any
	if !ev.OccurredAt.IsZero() {
		occurred = ev.OccurredAt
	}
	var row pgx.Row
	if ev.CorrectsEventID == "" {
		row = sp.QueryRow(ctx, `SELECT item_id, idempotency_key, state, quarantine_reason, created
			FROM aurora.record_usage($1, $2, $3, $4, $5)`, ev.Tenant, ev.EventID, ev.Feature, ev.Quantity, occurred)
	} else {
		row = sp.QueryRow(ctx, `SELECT item_id, idempotency_key, state, quarantine_reason, created
			FROM aurora.record_usage_correction($1, $2, $3, $4, $5, $6)`,
			ev.Tenant, ev.EventID, ev.CorrectsEventID, ev.Feature, ev.Quantity, occurred)
	}
	var r SQLResult
	var state string
	if err := row.Scan(&r.ItemID, &r.IdempotencyKey, &state, &r.QuarantineReason, &r.Created); err != nil {
		return SQLResult{}, FromSQL(err)
	}
	r.State = outbox.State(state)
	return r, sp.Commit(ctx)
}
