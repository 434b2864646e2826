package inbox

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	"github.com/aurora-billing/aurora/shared/clock"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrStore is wrapped by every failure to store a received event: the
// endpoint answers 5xx and Stripe redelivers.
var ErrStore = errors.New("inbox: store failed")

// Received is a verified event ready to be stored.
type Received struct {
	EventID    string
	Type       string
	APIVersion string     // "" when absent
	Created    *time.Time // nil when absent
	Livemode   bool
	Customer   string // "" when data.object names none
	Payload    []byte // the raw body, verbatim
}

// StoreResult says what Ingest did.
type StoreResult int

const (
	// StoreInserted: a new row was committed.
	StoreInserted StoreResult = iota + 1
	// StoreDuplicate: the event id was already stored with the same body.
	StoreDuplicate
	// StoreConflict: the event id was already stored with another body; the
	// new body is kept in billing_event_id_conflicts, never applied.
	StoreConflict
)

// Store writes received events into billing_events.
type Store struct {
	pool  *pgxpool.Pool
	clock clock.Clock
}

// NewStore returns a Store on pool; c nil means the database clock.
func NewStore(pool *pgxpool.Pool, c clock.Clock) *Store {
	return &Store{pool: pool, clock: clock.Or(c)}
}

const sqlIngest = `
INSERT INTO billing_events
    (event_id, event_type, api_version, event_created, livemode, customer_id, payload, payload_sha256, received_at, next_attempt_at)
VALUES ($1, $2, NULLIF($3, ''), $4, $5, NULLIF($6, ''), $7, $8, coalesce($9::timestamptz, now()), coalesce($9::timestamptz, now()))
ON CONFLICT (event_id) DO NOTHING`

const sqlIngestConflict = `
WITH existing AS (SELECT payload_sha256 FROM billing_events WHERE event_id = $1)
INSERT INTO billing_event_id_conflicts (event_id, payload, payload_sha256, received_at)
SELECT $1, $2, $3, coalesce($4::timestamptz, now()) FROM existing WHERE existing.payload_sha256 <> $3
ON CONFLICT (event_id, payload_sha256) DO NOTHING
RETURNING 1`

// Ingest stores ev durably (one autocommit statement) and returns only after
// the commit. A redelivery of a stored id is StoreDuplicate (or
// StoreConflict when the body differs). Errors wrap ErrStore.
func (s *Store) Ingest(ctx context.Context, ev Received) (StoreResult, error) {
	sum := sha256.Sum256(ev.Payload)
	now := s.clock.Override()
	tag, err := s.pool.Exec(ctx, sqlIngest, ev.EventID, ev.Type, ev.APIVersion, ev.Created, ev.Livemode, ev.Customer, ev.Payload, sum[:], now)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrStore, err)
	}
	if tag.RowsAffected() == 1 {
		return StoreInserted, nil
	}
	var one int
	err = s.pool.QueryRow(ctx, sqlIngestConflict, ev.EventID, ev.Payload, sum[:], now).Scan(&one)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		// same body, or this conflicting body was already kept
		var same bool
		if err := s.pool.QueryRow(ctx, `SELECT payload_sha256 = $2 FROM billing_events WHERE event_id = $1`, ev.EventID, sum[:]).Scan(&same); err != nil {
			return 0, fmt.Errorf("%w: %w", ErrStore, err)
		}
		if same {
			return StoreDuplicate, nil
		}
		return StoreConflict, nil
	case err != nil:
		return 0, fmt.Errorf("%w: %w", ErrStore, err)
	default:
		return StoreConflict, nil
	}
}
