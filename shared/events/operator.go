package events

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aurora-billing/aurora/shared/clock"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Row is one event_outbox row as operators see it (no payload; Inspect has
// it on request).
type Row struct {
	ID             string     `json:"event_id"`
	Type           string     `json:"event_type"`
	AggregateID    string     `json:"aggregate_id"`
	Status         Status     `json:"status"`
	Attempts       int        `json:"attempts"`
	LastReason     string     `json:"last_reason,omitempty"`
	LastError      string     `json:"last_error,omitempty"`
	StreamSeq      *int64     `json:"stream_seq,omitempty"`
	CreatedAt      time.Time  `json:"created_at"`
	DispatchedAt   *time.Time `json:"dispatched_at,omitempty"`
	AcknowledgedAt *time.Time `json:"acknowledged_at,omitempty"`
	DeadLetteredAt *time.Time `json:"dead_lettered_at,omitempty"`
}

const rowColumns = `event_id::text, event_type, aggregate_id, status, attempts, coalesce(last_reason, ''),
coalesce(last_error, ''), stream_seq, created_at, dispatched_at, acknowledged_at, dead_lettered_at`

func scanRow(r pgx.Row) (Row, error) {
	var x Row
	var st string
	err := r.Scan(&x.ID, &x.Type, &x.AggregateID, &st, &x.Attempts, &x.LastReason, &x.LastError, &x.StreamSeq,
		&x.CreatedAt, &x.DispatchedAt, &x.AcknowledgedAt, &x.DeadLetteredAt)
	x.Status = Status(st)
	return x, err
}

// InboxRow is one consumer's inbox row for an event.
type InboxRow struct {
	Consumer            string      `json:"consumer"`
	EventID             string      `json:"event_id"`
	EventType           string      `json:"event_type,omitempty"`
	Status              InboxStatus `json:"status"`
	Attempts            int         `json:"attempts"`
	NextAttemptAt       *time.Time  `json:"next_attempt_at,omitempty"`
	LastError           string      `json:"last_error,omitempty"`
	ClaimedAt           time.Time   `json:"claimed_at"`
	ProcessedAt         *time.Time  `json:"processed_at,omitempty"`
	DuplicateDeliveries int         `json:"duplicate_deliveries"`
	DeadLetteredAt      *time.Time  `json:"dead_lettered_at,omitempty"`
	DeadLetterReason    string      `json:"dead_letter_reason,omitempty"`
}

const inboxColumns = `i.consumer, i.event_id::text, o.event_type, i.status, i.attempts, i.next_attempt_at, coalesce(i.last_error, ''),
i.claimed_at, i.processed_at, i.duplicate_deliveries, i.dead_lettered_at, coalesce(i.dead_letter_reason, '')`

func scanInbox(r pgx.Row) (InboxRow, error) {
	var x InboxRow
	var st string
	err := r.Scan(&x.Consumer, &x.EventID, &x.EventType, &st, &x.Attempts, &x.NextAttemptAt, &x.LastError, &x.ClaimedAt,
		&x.ProcessedAt, &x.DuplicateDeliveries, &x.DeadLetteredAt, &x.DeadLetterReason)
	x.Status = InboxStatus(st)
	return x, err
}

// ListFilter narrows List. Zero values mean "any"; Limit defaults to 50
// (at most 1000).
type ListFilter struct {
	Status Status
	Type   string
	Limit  int
}

// Validate returns a *FieldError for an unknown status, a malformed type
// or a limit outside 0..1000.
func (f ListFilter) Validate() error {
	if f.Status != "" && !f.Status.Valid() {
		return &FieldError{Field: "status", Reason: "must be one of pending, dispatching, dispatched, acknowledged, failed, dead_letter"}
	}
	if f.Type != "" && !ValidType(f.Type) {
		return &FieldError{Field: "type", Reason: `must look like "Name.v1"`}
	}
	if f.Limit < 0 || f.Limit > 1000 {
		return &FieldError{Field: "limit", Reason: "must be 0..1000"}
	}
	return nil
}

// List returns outbox rows matching f, oldest first.
func List(ctx context.Context, db *pgxpool.Pool, f ListFilter) ([]Row, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	if f.Limit == 0 {
		f.Limit = 50
	}
	rows, err := db.Query(ctx, `SELECT `+rowColumns+` FROM event_outbox
		WHERE ($1 = '' OR status = $1) AND ($2 = '' OR event_type = $2)
		ORDER BY created_at, event_id LIMIT $3`, string(f.Status), f.Type, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("events: list: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Row, error) { return scanRow(r) })
}

// ListDeadLetters returns inbox dead letters (all consumers when consumer
// is empty), oldest first, at most limit (default 50, at most 1000).
func ListDeadLetters(ctx context.Context, db *pgxpool.Pool, consumer string, limit int) ([]InboxRow, error) {
	if limit < 0 || limit > 1000 {
		return nil, &FieldError{Field: "limit", Reason: "must be 0..1000"}
	}
	if limit == 0 {
		limit = 50
	}
	rows, err := db.Query(ctx, `SELECT `+inboxColumns+` FROM event_inbox i JOIN event_outbox o USING (event_id)
		WHERE i.dead_lettered_at IS NOT NULL AND ($1 = '' OR i.consumer = $1)
		ORDER BY i.dead_lettered_at, i.event_id LIMIT $2`, consumer, limit)
	if err != nil {
		return nil, fmt.Errorf("events: list dead letters: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (InboxRow, error) { return scanInbox(r) })
}

// Detail is one event with every consumer's view of it.
type Detail struct {
	Row
	Payload []byte `json:"payload,omitempty"`
	// Inbox holds the inbox rows of every consumer that claimed it.
	Inbox []InboxRow `json:"inbox"`
	// Waiting names the registered consumers of its type without a
	// processed inbox row: whom acknowledgement waits for.
	Waiting []string `json:"waiting_for"`
	// Requeues is the audit trail of operator requeues of this event.
	Requeues []RequeueRecord `json:"requeues"`
}

// RequeueRecord is one audited operator requeue (event_requeues).
type RequeueRecord struct {
	Consumer    string    `json:"consumer,omitempty"`
	Operator    string    `json:"operator"`
	Reason      string    `json:"reason"`
	Outcome     string    `json:"outcome"`
	Detail      string    `json:"detail,omitempty"`
	RequestedAt time.Time `json:"requested_at"`
}

// Inspect returns event id with its inbox rows, the consumers it waits for
// and its requeues; the payload only when withPayload. ErrNotFound when no
// such event; *FieldError for a malformed id.
func Inspect(ctx context.Context, db *pgxpool.Pool, id string, withPayload bool) (Detail, error) {
	if !ValidID(id) {
		return Detail{}, &FieldError{Field: "event_id", Reason: "must be a lowercase UUID"}
	}
	var d Detail
	var err error
	var payload []byte
	d.Row, err = scanRowWith(db.QueryRow(ctx, `SELECT `+rowColumns+`, payload::text FROM event_outbox WHERE event_id = $1`, id), &payload)
	if errors.Is(err, pgx.ErrNoRows) {
		return Detail{}, fmt.Errorf("%w: event %s", ErrNotFound, id)
	}
	if err != nil {
		return Detail{}, fmt.Errorf("events: inspect: %w", err)
	}
	if withPayload {
		d.Payload = payload
	}
	rows, err := db.Query(ctx, `SELECT `+inboxColumns+` FROM event_inbox i JOIN event_outbox o USING (event_id) WHERE i.event_id = $1 ORDER BY i.consumer`, id)
	if err != nil {
		return Detail{}, fmt.Errorf("events: inspect: %w", err)
	}
	if d.Inbox, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (InboxRow, error) { return scanInbox(r) }); err != nil {
		return Detail{}, fmt.Errorf("events: inspect: %w", err)
	}
	rows, err = db.Query(ctx, `SELECT c.consumer FROM event_consumers c
		WHERE $2 = ANY (c.event_types) AND NOT EXISTS (
			SELECT 1 FROM event_inbox i WHERE i.consumer = c.consumer AND i.event_id = $1 AND i.status = 'processed')
		ORDER BY c.consumer`, id, d.Type)
	if err != nil {
		return Detail{}, fmt.Errorf("events: inspect: %w", err)
	}
	if d.Waiting, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		return Detail{}, fmt.Errorf("events: inspect: %w", err)
	}
	rows, err = db.Query(ctx, `SELECT coalesce(consumer, ''), operator, reason, outcome, coalesce(detail, ''), requested_at
		FROM event_requeues WHERE event_id = $1 ORDER BY id`, id)
	if err != nil {
		return Detail{}, fmt.Errorf("events: inspect: %w", err)
	}
	if d.Requeues, err = pgx.CollectRows(rows, pgx.RowToStructByPos[RequeueRecord]); err != nil {
		return Detail{}, fmt.Errorf("events: inspect: %w", err)
	}
	if d.Inbox == nil {
		d.Inbox = []InboxRow{}
	}
	if d.Waiting == nil {
		d.Waiting = []string{}
	}
	if d.Requeues == nil {
		d.Requeues = []RequeueRecord{}
	}
	return d, nil
}

func scanRowWith(r pgx.Row, extra ...any) (Row, error) {
	return scanRow(rowFunc(func(dest ...any) error { return r.Scan(append(dest, extra...)...) }))
}

type rowFunc func(dest ...any) error

func (f rowFunc) Scan(dest ...any) error { return f(dest...) }

// RequeueRequest asks to requeue one dead-lettered event: for Consumer (its
// inbox dead letter gets a fresh attempt budget and the outbox row returns
// to dispatched), or, with Consumer empty, an event whose dispatch was
// dead-lettered (back to pending with a fresh budget). Operator and Reason
// are required and audited.
type RequeueRequest struct {
	EventID  string
	Consumer string
	Operator string
	Reason   string
}

// RequeuePlan is what a requeue does or would do.
type RequeuePlan struct {
	EventID  string `json:"event_id"`
	Consumer string `json:"consumer,omitempty"`
	// From and To describe the change ("inbox failed (dead-lettered) →
	// failed, due now, attempts 0"; "outbox dead_letter → dispatched").
	Changes []string `json:"changes"`
	Applied bool     `json:"applied"`
}

// Requeue requeues one dead letter (see RequeueRequest). With apply false it
// changes nothing and returns the plan; with apply true it applies it and
// records an event_requeues row (operator, reason). A refusal is recorded
// too, when the event exists. Errors: *FieldError / ErrInvalidRequest for a
// malformed request, ErrNotFound, ErrNotDeadLettered (atom
// not_dead_lettered) when the row is not dead-lettered.
func Requeue(ctx context.Context, db *pgxpool.Pool, clk clock.Clock, req RequeueRequest, apply bool) (RequeuePlan, error) {
	clk = clock.Or(clk)
	if !ValidID(req.EventID) {
		return RequeuePlan{}, &FieldError{Field: "event_id", Reason: "must be a lowercase UUID"}
	}
	if strings.TrimSpace(req.Operator) == "" || strings.TrimSpace(req.Reason) == "" {
		return RequeuePlan{}, fmt.Errorf("%w: operator and reason are required", ErrInvalidRequest)
	}
	plan := RequeuePlan{EventID: req.EventID, Consumer: req.Consumer}
	tx, err := db.Begin(ctx)
	if err != nil {
		return plan, fmt.Errorf("events: requeue: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
	var status, reason string
	err = tx.QueryRow(ctx, `SELECT status, coalesce(last_reason, '') FROM event_outbox WHERE event_id = $1 FOR NO KEY UPDATE`, req.EventID).Scan(&status, &reason)
	if errors.Is(err, pgx.ErrNoRows) {
		return plan, fmt.Errorf("%w: event %s", ErrNotFound, req.EventID)
	}
	if err != nil {
		return plan, fmt.Errorf("events: requeue: %w", err)
	}
	refuse := func(why string) (RequeuePlan, error) {
		if apply {
			_ = tx.Rollback(ctx)
			_, _ = db.Exec(ctx, `INSERT INTO event_requeues (event_id, consumer, operator, reason, outcome, detail, requested_at)
				VALUES ($1, nullif($2, ''), $3, $4, 'refused', $5, coalesce($6::timestamptz, now()))`,
				req.EventID, req.Consumer, req.Operator, req.Reason, why, clk.Override())
		}
		return plan, fmt.Errorf("%w: %s", ErrNotDeadLettered, why)
	}
	now := clk.Override()
	if req.Consumer == "" {
		if status != string(StatusDeadLetter) || reason != string(ReasonDispatchExhausted) {
			return refuse(fmt.Sprintf("event is %s (%s), not a dispatch dead letter; name --consumer for a consumer's dead letter", status, orDash(reason)))
		}
		plan.Changes = []string{"outbox dead_letter (dispatch_exhausted) → pending, attempts 0, due now"}
		if apply {
			if _, err := tx.Exec(ctx, `UPDATE event_outbox SET status = 'pending', attempts = 0, dead_lettered_at = NULL,
				next_attempt_at = coalesce($2::timestamptz, now()), last_reason = NULL WHERE event_id = $1`, req.EventID, now); err != nil {
				return plan, fmt.Errorf("events: requeue: %w", err)
			}
		}
	} else {
		var dead bool
		err := tx.QueryRow(ctx, `SELECT dead_lettered_at IS NOT NULL FROM event_inbox WHERE consumer = $1 AND event_id = $2 FOR UPDATE`,
			req.Consumer, req.EventID).Scan(&dead)
		if errors.Is(err, pgx.ErrNoRows) {
			return refuse("consumer " + req.Consumer + " has no inbox row for this event")
		}
		if err != nil {
			return plan, fmt.Errorf("events: requeue: %w", err)
		}
		if !dead {
			return refuse("consumer " + req.Consumer + "'s inbox row is not dead-lettered")
		}
		plan.Changes = []string{"inbox " + req.Consumer + ": failed (dead-lettered) → failed, attempts 0, due now"}
		if status == string(StatusDeadLetter) {
			plan.Changes = append(plan.Changes, "outbox dead_letter → dispatched (catch-up lists it again)")
		}
		if apply {
			if _, err := tx.Exec(ctx, `UPDATE event_inbox SET attempts = 0, dead_lettered_at = NULL, dead_letter_reason = NULL,
				next_attempt_at = coalesce($3::timestamptz, now()) WHERE consumer = $1 AND event_id = $2`, req.Consumer, req.EventID, now); err != nil {
				return plan, fmt.Errorf("events: requeue: %w", err)
			}
			if status == string(StatusDeadLetter) {
				if _, err := tx.Exec(ctx, `UPDATE event_outbox SET status = 'dispatched', dead_lettered_at = NULL, last_reason = NULL,
					dispatched_at = coalesce(dispatched_at, coalesce($2::timestamptz, now())) WHERE event_id = $1`, req.EventID, now); err != nil {
					return plan, fmt.Errorf("events: requeue: %w", err)
				}
			}
		}
	}
	if !apply {
		return plan, nil
	}
	if _, err := tx.Exec(ctx, `INSERT INTO event_requeues (event_id, consumer, operator, reason, outcome, detail, requested_at)
		VALUES ($1, nullif($2, ''), $3, $4, 'applied', $5, coalesce($6::timestamptz, now()))`,
		req.EventID, req.Consumer, req.Operator, req.Reason, strings.Join(plan.Changes, "; "), now); err != nil {
		return plan, fmt.Errorf("events: requeue: audit: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return plan, fmt.Errorf("events: requeue: %w", err)
	}
	plan.Applied = true
	return plan, nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// sqlStuck lists seed 004's stuck events: dispatched, yet every consumer
// registered for the type has a processed inbox row (and at least one
// consumer exists), so nothing will ever acknowledge them and the catch-up
// loops keep listing them.
const sqlStuck = `
SELECT o.event_id::text, o.event_type, o.dispatched_at,
       (SELECT array_agg(i.consumer ORDER BY i.consumer) FROM event_inbox i
         WHERE i.event_id = o.event_id AND i.status = 'processed')
  FROM event_outbox o
 WHERE o.status = 'dispatched'
   AND EXISTS (SELECT 1 FROM event_consumers c WHERE o.event_type = ANY (c.event_types))
   AND NOT EXISTS (
       SELECT 1 FROM event_consumers c
        WHERE o.event_type = ANY (c.event_types)
          AND NOT EXISTS (SELECT 1 FROM event_inbox i
                           WHERE i.consumer = c.consumer AND i.event_id = o.event_id AND i.status = 'processed'))
 ORDER BY o.dispatched_at, o.event_id`

// StuckEvent is one event CleanupStuck acknowledges (or would).
type StuckEvent struct {
	ID           string     `json:"event_id"`
	Type         string     `json:"event_type"`
	DispatchedAt *time.Time `json:"dispatched_at,omitempty"`
	ProcessedBy  []string   `json:"processed_by"`
}

// CleanupStuck finds every dispatched event whose inbox rows are processed
// for every registered consumer of its type (seed 004's cleanup of stuck
// historical events) and, when apply, moves exactly those to acknowledged
// in one transaction. With apply false it changes nothing. It returns the
// events found (and, when apply, acknowledged).
func CleanupStuck(ctx context.Context, db *pgxpool.Pool, clk clock.Clock, apply bool) ([]StuckEvent, error) {
	clk = clock.Or(clk)
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("events: cleanup-stuck: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
	q := sqlStuck
	if apply {
		q += ` FOR NO KEY UPDATE OF o`
	}
	rows, err := tx.Query(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("events: cleanup-stuck: %w", err)
	}
	found, err := pgx.CollectRows(rows, pgx.RowToStructByPos[StuckEvent])
	if err != nil {
		return nil, fmt.Errorf("events: cleanup-stuck: %w", err)
	}
	if !apply || len(found) == 0 {
		return found, nil
	}
	ids := make([]string, len(found))
	for i, e := range found {
		ids[i] = e.ID
	}
	tag, err := tx.Exec(ctx, `UPDATE event_outbox SET status = 'acknowledged', acknowledged_at = coalesce($2::timestamptz, now())
		WHERE event_id = ANY ($1::uuid[]) AND status = 'dispatched'`, ids, clk.Override())
	if err != nil {
		return nil, fmt.Errorf("events: cleanup-stuck: %w", err)
	}
	if tag.RowsAffected() != int64(len(ids)) {
		return nil, fmt.Errorf("events: cleanup-stuck: acknowledged %d of %d rows; rolled back", tag.RowsAffected(), len(ids))
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("events: cleanup-stuck: %w", err)
	}
	return found, nil
}
