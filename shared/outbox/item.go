package outbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/aurora-billing/aurora/shared/field"
	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DefaultExporter is the exporter name of Stripe billing meter events.
const DefaultExporter = "stripe_meter_events"

// Item is what a caller stages: the identity plus the immutable payload.
type Item struct {
	identity.Identity
	Feature     string          // e.g. "api_calls"; mapped to a Stripe meter at send time
	Quantity    int64           // the meter event value (a correction may be negative)
	OccurredAt  time.Time       // sent as the meter event timestamp (Unix seconds); fixed here, never rewritten
	PeriodStart time.Time       // usage period the quantity belongs to (UTC); defaults to OccurredAt truncated to the day
	Payload     json.RawMessage // extra attributes, a JSON object; nil means {}
}

// Validate returns a *FieldError (wrapping ErrInvalidItem, and
// identity.ErrInvalid for identity fields) naming the first bad field: the
// identity's rules (identity.Identity.Validate), a feature name
// (field.Feature), a quantity within 15 significant digits
// (field.MaxQuantity, Stripe's limit on a meter event value), a set
// occurred_at and a payload that is a JSON object.
func (it Item) Validate() error {
	if err := it.Identity.Validate(); err != nil {
		var fe *identity.FieldError
		if errors.As(err, &fe) {
			return fmt.Errorf("%w: %w", &FieldError{Field: fe.Field, Reason: fe.Reason}, err)
		}
		return err
	}
	if r := field.Feature(it.Feature); r != "" {
		return &FieldError{Field: "feature", Reason: r}
	}
	if r := field.Quantity(it.Quantity, true); r != "" {
		return &FieldError{Field: "quantity", Reason: r}
	}
	if it.OccurredAt.IsZero() {
		return &FieldError{Field: "occurred_at", Reason: "must be set"}
	}
	if len(it.Payload) > 0 {
		var obj map[string]json.RawMessage
		trimmed := bytes.TrimSpace(it.Payload)
		if len(trimmed) == 0 || trimmed[0] != '{' || json.Unmarshal(trimmed, &obj) != nil {
			return &FieldError{Field: "payload", Reason: "must be a JSON object"}
		}
	}
	return nil
}

func (it Item) payloadOrEmpty() []byte {
	if len(it.Payload) == 0 {
		return []byte("{}")
	}
	return it.Payload
}

func (it Item) periodStart() time.Time {
	if it.PeriodStart.IsZero() {
		return it.OccurredAt.UTC().Truncate(24 * time.Hour)
	}
	return it.PeriodStart.UTC()
}

// Row is an outbox_items row as stored.
type Row struct {
	ID int64 `json:"id"`
	identity.Identity
	IdempotencyKey    string          `json:"idempotency_key"`
	Feature           string          `json:"feature"`
	Quantity          int64           `json:"quantity"`
	OccurredAt        time.Time       `json:"occurred_at"`
	PeriodStart       time.Time       `json:"period_start"`
	Payload           json.RawMessage `json:"payload"`
	State             State           `json:"state"`
	QuarantineReason  *Reason         `json:"quarantine_reason"`
	LeaseToken        int64           `json:"lease_token"`
	LeaseExpiresAt    *time.Time      `json:"lease_expires_at"`
	Attempts          int32           `json:"attempts"`
	NextAttemptAt     time.Time       `json:"next_attempt_at"`
	FirstAttemptAt    *time.Time      `json:"first_attempt_at"`
	Dispatch          int32           `json:"dispatch"`
	PublishedDispatch int32           `json:"published_dispatch"`
	PublishedAt       *time.Time      `json:"published_at"`
	LastError         *string         `json:"last_error"`
	ProviderRef       *string         `json:"provider_ref"`
	CreatedAt         time.Time       `json:"created_at"`
	UpdatedAt         time.Time       `json:"updated_at"`
}

// Columns is the select list that ScanRow reads, in order. Qualify it with
// a table alias by prefixing yourself if needed.
const Columns = `id, tenant, subject_kind, subject_ref, exporter, destination_account, mode, mapping_version,
	idempotency_key, feature, quantity, occurred_at, period_start, payload, state, quarantine_reason,
	lease_token, lease_expires_at, attempts, next_attempt_at, first_attempt_at, dispatch,
	published_dispatch, published_at, last_error, provider_ref, created_at, updated_at`

// ScanRow scans one row selected with Columns.
func ScanRow(r pgx.Row) (Row, error) {
	var x Row
	var kind, mode, state string
	var reason *string
	err := r.Scan(&x.ID, &x.Tenant, &kind, &x.SubjectRef, &x.Exporter, &x.DestinationAccount, &mode, &x.MappingVersion,
		&x.IdempotencyKey, &x.Feature, &x.Quantity, &x.OccurredAt, &x.PeriodStart, &x.Payload, &state, &reason,
		&x.LeaseToken, &x.LeaseExpiresAt, &x.Attempts, &x.NextAttemptAt, &x.FirstAttemptAt, &x.Dispatch,
		&x.PublishedDispatch, &x.PublishedAt, &x.LastError, &x.ProviderRef, &x.CreatedAt, &x.UpdatedAt)
	if err != nil {
		return Row{}, err
	}
	x.SubjectKind = identity.SubjectKind(kind)
	x.Mode = identity.Mode(mode)
	x.State = State(state)
	if reason != nil {
		r := Reason(*reason)
		x.QuarantineReason = &r
	}
	return x, nil
}

// Querier is what Stage and Get need: a pgx.Tx, *pgx.Conn or *pgxpool.Pool.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Get returns the item with id, or ErrNotFound.
func Get(ctx context.Context, q Querier, id int64) (Row, error) {
	row, err := ScanRow(q.QueryRow(ctx, `SELECT `+Columns+` FROM outbox_items WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Row{}, fmt.Errorf("%w: item %d", ErrNotFound, id)
	}
	return row, err
}
