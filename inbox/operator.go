package inbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aurora-billing/aurora/shared/clock"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Operator errors.
var (
	// ErrEventNotFound: no billing_events row has this event id.
	ErrEventNotFound = errors.New("inbox: event not found")
	// ErrNotDeadLetter: requeue applies only to a dead letter; the row is
	// pending or processed (a *StateError carries which).
	ErrNotDeadLetter = errors.New("inbox: event is not a dead letter")
	// ErrInvalidRequeue: operator or reason missing.
	ErrInvalidRequeue = errors.New("inbox: invalid requeue")
)

// StateError says which state refused an operator action. It wraps
// ErrNotDeadLetter.
type StateError struct {
	EventID string
	State   EventState
}

func (e *StateError) Error() string {
	return fmt.Sprintf("inbox: event %s is %s, not a dead letter", e.EventID, e.State)
}

// Unwrap returns ErrNotDeadLetter.
func (e *StateError) Unwrap() error { return ErrNotDeadLetter }

// EventState is a billing_events row's state, derived from its columns.
type EventState string

const (
	// StatePending: processed_at and dead_letter_at NULL. In: ingest, a
	// deferral, a linkage wakeup, a requeue. Out: the worker.
	StatePending EventState = "pending"
	// StateProcessed: processed_at set, by the worker with the projection.
	// Terminal.
	StateProcessed EventState = "processed"
	// StateDeadLetter: dead_letter_at set, by the worker (quarantine or
	// spent budget). Out: a linkage revival (customer_not_linked only) or an
	// operator requeue.
	StateDeadLetter EventState = "dead_letter"
)

// Querier is what the read-only operator functions need (*pgxpool.Pool,
// pgx.Tx, *pgx.Conn).
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Inventory is seed 003's read-only operator inventory.
type Inventory struct {
	Pending             int64  `json:"pending"`
	DeadLetter          int64  `json:"dead_letter"`
	HighestAttemptCount *int64 `json:"highest_attempt_count"` // null when nothing is unprocessed
}

// ReadInventory runs the seed's inventory query, verbatim in substance.
func ReadInventory(ctx context.Context, q Querier) (Inventory, error) {
	var inv Inventory
	err := q.QueryRow(ctx, `
SELECT count(*) FILTER (WHERE processed_at IS NULL AND dead_letter_at IS NULL) AS pending,
       count(*) FILTER (WHERE processed_at IS NULL AND dead_letter_at IS NOT NULL) AS dead_letter,
       max(attempts) FILTER (WHERE processed_at IS NULL) AS highest_attempt_count
  FROM billing_events WHERE provider = 'stripe'`).Scan(&inv.Pending, &inv.DeadLetter, &inv.HighestAttemptCount)
	if err != nil {
		return Inventory{}, fmt.Errorf("inbox: inventory: %w", err)
	}
	return inv, nil
}

// EventInfo is one event as an operator sees it: never the payload unless
// asked, never the customer id.
type EventInfo struct {
	EventID       string     `json:"event_id"`
	Type          string     `json:"type"`
	APIVersion    *string    `json:"api_version"`
	EventCreated  *time.Time `json:"event_created"`
	ReceivedAt    time.Time  `json:"received_at"`
	State         EventState `json:"state"`
	Attempts      int        `json:"attempts"`
	NextAttemptAt time.Time  `json:"next_attempt_at"`
	LastReason    *string    `json:"last_reason"`
	LastError     *string    `json:"last_error"`
	ProcessedAt   *time.Time `json:"processed_at"`
	Outcome       *string    `json:"outcome"`
	DeadLetterAt  *time.Time `json:"dead_letter_at"`
	Requeues      []Requeue  `json:"requeues,omitempty"`
	Payload       *string    `json:"payload,omitempty"` // only when asked
}

// Requeue is one audited operator requeue.
type Requeue struct {
	Operator      string    `json:"operator"`
	Reason        string    `json:"reason"`
	PriorAttempts int       `json:"prior_attempts"`
	PriorReason   *string   `json:"prior_reason"`
	RequeuedAt    time.Time `json:"requeued_at"`
}

const eventColumns = `event_id, event_type, api_version, event_created, received_at, attempts, next_attempt_at,
       last_reason, last_error, processed_at, outcome, dead_letter_at`

func scanEvent(row pgx.Row) (EventInfo, error) {
	var e EventInfo
	err := row.Scan(&e.EventID, &e.Type, &e.APIVersion, &e.EventCreated, &e.ReceivedAt, &e.Attempts, &e.NextAttemptAt,
		&e.LastReason, &e.LastError, &e.ProcessedAt, &e.Outcome, &e.DeadLetterAt)
	switch {
	case e.ProcessedAt != nil:
		e.State = StateProcessed
	case e.DeadLetterAt != nil:
		e.State = StateDeadLetter
	default:
		e.State = StatePending
	}
	return e, err
}

// ListDeadLetters returns up to limit dead letters, oldest first.
func ListDeadLetters(ctx context.Context, q Querier, limit int) ([]EventInfo, error) {
	rows, err := q.Query(ctx, `SELECT `+eventColumns+` FROM billing_events
 WHERE provider = 'stripe' AND processed_at IS NULL AND dead_letter_at IS NOT NULL
 ORDER BY dead_letter_at, event_id LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("inbox: list dead letters: %w", err)
	}
	defer rows.Close()
	out := []EventInfo{}
	for rows.Next() {
		e, err := scanEvent(rows)
		if err != nil {
			return nil, fmt.Errorf("inbox: list dead letters: %w", err)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("inbox: list dead letters: %w", err)
	}
	return out, nil
}

// Inspect returns one event with its requeue history; the raw payload only
// when withPayload. ErrEventNotFound when no row has the id.
func Inspect(ctx context.Context, q Querier, eventID string, withPayload bool) (EventInfo, error) {
	e, err := scanEvent(q.QueryRow(ctx, `SELECT `+eventColumns+` FROM billing_events WHERE event_id = $1`, eventID))
	if errors.Is(err, pgx.ErrNoRows) {
		return EventInfo{}, fmt.Errorf("%w: %s", ErrEventNotFound, eventID)
	}
	if err != nil {
		return EventInfo{}, fmt.Errorf("inbox: inspect: %w", err)
	}
	rows, err := q.Query(ctx, `SELECT operator, reason, prior_attempts, prior_reason, requeued_at
  FROM billing_event_requeues WHERE event_id = $1 ORDER BY id`, eventID)
	if err != nil {
		return EventInfo{}, fmt.Errorf("inbox: inspect: %w", err)
	}
	e.Requeues, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Requeue, error) {
		var rq Requeue
		err := r.Scan(&rq.Operator, &rq.Reason, &rq.PriorAttempts, &rq.PriorReason, &rq.RequeuedAt)
		return rq, err
	})
	if err != nil {
		return EventInfo{}, fmt.Errorf("inbox: inspect: %w", err)
	}
	if withPayload {
		var p []byte
		if err := q.QueryRow(ctx, `SELECT payload FROM billing_events WHERE event_id = $1`, eventID).Scan(&p); err != nil {
			return EventInfo{}, fmt.Errorf("inbox: inspect: %w", err)
		}
		s := string(p)
		e.Payload = &s
	}
	return e, nil
}

// RequeueInput names the single dead letter to re-enable and who decided it.
type RequeueInput struct {
	EventID  string
	Operator string
	Reason   string
}

// Validate returns ErrInvalidRequeue naming the missing field.
func (in RequeueInput) Validate() error {
	switch {
	case strings.TrimSpace(in.EventID) == "":
		return fmt.Errorf("%w: event id is required", ErrInvalidRequeue)
	case strings.TrimSpace(in.Operator) == "":
		return fmt.Errorf("%w: operator is required", ErrInvalidRequeue)
	case strings.TrimSpace(in.Reason) == "":
		return fmt.Errorf("%w: reason is required", ErrInvalidRequeue)
	}
	return nil
}

// RequeueDeadLetter re-enables exactly one dead letter in one transaction:
// it records operator, reason and the prior budget in
// billing_event_requeues, then makes the row pending and due now with a
// fresh attempt budget (seed 003's explicit single-event recovery). Errors:
// ErrInvalidRequeue, ErrEventNotFound, *StateError (ErrNotDeadLetter).
// c nil means the database clock.
func RequeueDeadLetter(ctx context.Context, pool *pgxpool.Pool, c clock.Clock, in RequeueInput) (EventInfo, error) {
	if err := in.Validate(); err != nil {
		return EventInfo{}, err
	}
	now := clock.Or(c).Override()
	var out EventInfo
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		cur, err := scanEvent(tx.QueryRow(ctx, `SELECT `+eventColumns+` FROM billing_events WHERE event_id = $1 FOR UPDATE`, in.EventID))
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: %s", ErrEventNotFound, in.EventID)
		}
		if err != nil {
			return err
		}
		if cur.State != StateDeadLetter {
			return &StateError{EventID: in.EventID, State: cur.State}
		}
		if _, err := tx.Exec(ctx, `
INSERT INTO billing_event_requeues (event_id, operator, reason, prior_attempts, prior_reason, prior_dead_letter_at, requeued_at)
VALUES ($1, $2, $3, $4, $5, $6, coalesce($7::timestamptz, now()))`,
			in.EventID, in.Operator, in.Reason, cur.Attempts, cur.LastReason, cur.DeadLetterAt, now); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `
UPDATE billing_events SET dead_letter_at = NULL, attempts = 0, next_attempt_at = coalesce($2::timestamptz, now())
 WHERE event_id = $1 AND processed_at IS NULL AND dead_letter_at IS NOT NULL`, in.EventID, now)
		if err != nil {
			return err
		}
		if tag.RowsAffected() != 1 {
			return fmt.Errorf("inbox: requeue touched %d rows, want 1", tag.RowsAffected())
		}
		out, err = Inspect(ctx, tx, in.EventID, false)
		return err
	})
	if err != nil {
		var se *StateError
		if errors.Is(err, ErrEventNotFound) || errors.As(err, &se) {
			return EventInfo{}, err
		}
		return EventInfo{}, fmt.Errorf("inbox: requeue: %w", err)
	}
	return out, nil
}
