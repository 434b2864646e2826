package recovery

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aurora-billing/aurora/shared/clock"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/jackc/pgx/v5"
)

// DB is what the service needs: a *pgxpool.Pool (or a *pgx.Conn).
type DB interface {
	outbox.Querier
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// Config configures a Service.
type Config struct {
	// Clock decides "now" for ages (List), requeue's next_attempt_at and
	// recovery_actions.created_at. Defaults to the database clock
	// (clock.DB); tests pass a *clock.Manual.
	Clock clock.Clock
}

// Service is the recovery API over one database. Safe for concurrent use.
type Service struct {
	db    DB
	clock clock.Clock
}

// New returns a Service over db.
func New(db DB, cfg Config) *Service {
	return &Service{db: db, clock: clock.Or(cfg.Clock)}
}

// Limits of List.
const (
	DefaultLimit = 50   // List's limit when 0 is given
	MaxLimit     = 1000 // the largest limit List accepts
)

// ListParams selects items for List.
type ListParams struct {
	// State is uncertain (default) or quarantined: the two states a person
	// resolves. Other states are ErrInvalidQuery.
	State outbox.State
	// OlderThan keeps items whose updated_at (for these states: when they
	// entered it, since nothing automatic updates them) is at least this
	// long before now (database clock). 0 lists all. Negative is
	// ErrInvalidQuery.
	OlderThan time.Duration
	// Reason filters quarantined items by quarantine reason; "" = any.
	Reason outbox.Reason
	// Limit is 1..MaxLimit; 0 means DefaultLimit.
	Limit int
}

// List returns items in p.State, oldest first (updated_at, then id). Errors:
// ErrInvalidQuery for bad parameters.
func (s *Service) List(ctx context.Context, p ListParams) ([]outbox.Row, error) {
	if p.State == "" {
		p.State = outbox.StateUncertain
	}
	if p.Limit == 0 {
		p.Limit = DefaultLimit
	}
	switch {
	case p.State != outbox.StateUncertain && p.State != outbox.StateQuarantined:
		return nil, fmt.Errorf("%w: state %q: list uncertain or quarantined", ErrInvalidQuery, string(p.State))
	case p.OlderThan < 0:
		return nil, fmt.Errorf("%w: older-than must be >= 0", ErrInvalidQuery)
	case p.Limit < 1 || p.Limit > MaxLimit:
		return nil, fmt.Errorf("%w: limit %d outside 1..%d", ErrInvalidQuery, p.Limit, MaxLimit)
	case p.Reason != "" && (p.State != outbox.StateQuarantined || !p.Reason.Valid()):
		return nil, fmt.Errorf("%w: reason %q: a known quarantine reason, with state quarantined", ErrInvalidQuery, string(p.Reason))
	}
	var reason *string
	if p.Reason != "" {
		r := string(p.Reason)
		reason = &r
	}
	rows, err := s.db.Query(ctx, `
		SELECT `+outbox.Columns+` FROM outbox_items
		WHERE state = $1
		  AND updated_at <= coalesce($2::timestamptz, now()) - make_interval(secs => $3::double precision)
		  AND ($4::text IS NULL OR quarantine_reason = $4)
		ORDER BY updated_at, id
		LIMIT $5`,
		string(p.State), s.clock.Override(), p.OlderThan.Seconds(), reason, p.Limit)
	if err != nil {
		return nil, fmt.Errorf("recovery: list: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (outbox.Row, error) { return outbox.ScanRow(r) })
	if err != nil {
		return nil, fmt.Errorf("recovery: list: %w", err)
	}
	return out, nil
}

// ListUncertain returns up to limit uncertain items that have been
// uncertain for at least olderThan, oldest first (seed 000,
// list_uncertain(older_than:, limit:)). limit 0 means DefaultLimit.
func (s *Service) ListUncertain(ctx context.Context, olderThan time.Duration, limit int) ([]outbox.Row, error) {
	return s.List(ctx, ListParams{State: outbox.StateUncertain, OlderThan: olderThan, Limit: limit})
}

// Attempt is one outbox_attempts row: one delivery attempt of an item.
type Attempt struct {
	ID              int64      `json:"id"`
	Attempt         int32      `json:"attempt"`
	LeaseToken      int64      `json:"lease_token"`
	StartedAt       time.Time  `json:"started_at"`
	FinishedAt      *time.Time `json:"finished_at"`
	Outcome         *string    `json:"outcome"` // accepted|retry|uncertain|rejected|quarantined|stale_lease; nil while in flight
	HTTPStatus      *int32     `json:"http_status"`
	StripeRequestID *string    `json:"stripe_request_id"`
	ErrorCode       *string    `json:"error_code"`
	ErrorMessage    *string    `json:"error_message"`
}

// Inspection is everything an operator needs to decide about one item.
type Inspection struct {
	Item outbox.Row `json:"item"`
	// SearchIdentifier is what to search for in Stripe's dashboard and
	// request logs: the meter event identifier and Idempotency-Key, i.e.
	// the item's idempotency key.
	SearchIdentifier string `json:"search_identifier"`
	// CurrentMappingVersion is the feature's mapping version on the
	// destination account now (0 = not mapped); a requeue is refused when it
	// differs from Item.MappingVersion.
	CurrentMappingVersion int32 `json:"current_mapping_version"`
	// Link is the usage fact that staged the item and still points at it
	// (nil when none does).
	Link *Link `json:"link"`
	// Expected is the expected-state map of this read (ExpectedOf(Item)).
	Expected Expected  `json:"expected"`
	Attempts []Attempt `json:"attempts"`
	Actions  []Action  `json:"actions"`
}

// Inspect returns the item with its attempts, its recovery actions and the
// identifier to search for at Stripe (seed 000, inspect_item). Errors:
// ErrNotFound.
func (s *Service) Inspect(ctx context.Context, id int64) (Inspection, error) {
	tx, err := s.db.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly, IsoLevel: pgx.RepeatableRead})
	if err != nil {
		return Inspection{}, fmt.Errorf("recovery: inspect: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read-only
	row, err := getItem(ctx, tx, id, false)
	if err != nil {
		return Inspection{}, err
	}
	ins := Inspection{Item: row, SearchIdentifier: row.IdempotencyKey, Expected: ExpectedOf(row)}
	if ins.CurrentMappingVersion, err = currentMappingVersion(ctx, tx, row); err != nil {
		return Inspection{}, err
	}
	if ins.Link, err = findLink(ctx, tx, row, false); err != nil {
		return Inspection{}, err
	}
	if ins.Attempts, err = attempts(ctx, tx, id); err != nil {
		return Inspection{}, err
	}
	if ins.Actions, err = actions(ctx, tx, id); err != nil {
		return Inspection{}, err
	}
	return ins, nil
}

// Actions returns the recovery actions recorded for item id, oldest first.
// Errors: ErrNotFound when the item does not exist.
func (s *Service) Actions(ctx context.Context, id int64) ([]Action, error) {
	if _, err := getItem(ctx, s.db, id, false); err != nil {
		return nil, err
	}
	return actions(ctx, s.db, id)
}

func getItem(ctx context.Context, q outbox.Querier, id int64, forUpdate bool) (outbox.Row, error) {
	sql := `SELECT ` + outbox.Columns + ` FROM outbox_items WHERE id = $1`
	if forUpdate {
		sql += ` FOR UPDATE`
	}
	row, err := outbox.ScanRow(q.QueryRow(ctx, sql, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return outbox.Row{}, fmt.Errorf("%w: item %d", ErrNotFound, id)
	}
	if err != nil {
		return outbox.Row{}, fmt.Errorf("recovery: read item %d: %w", id, err)
	}
	return row, nil
}

func currentMappingVersion(ctx context.Context, q outbox.Querier, row outbox.Row) (int32, error) {
	var v int32
	err := q.QueryRow(ctx, `SELECT coalesce((SELECT mapping_version FROM meter_mappings WHERE destination_account = $1 AND feature = $2), 0)`,
		row.DestinationAccount, row.Feature).Scan(&v)
	if err != nil {
		return 0, fmt.Errorf("recovery: mapping version: %w", err)
	}
	return v, nil
}

func attempts(ctx context.Context, q outbox.Querier, id int64) ([]Attempt, error) {
	rows, err := q.Query(ctx, `
		SELECT id, attempt, lease_token, started_at, finished_at, outcome, http_status, stripe_request_id, error_code, error_message
		FROM outbox_attempts WHERE item_id = $1 ORDER BY attempt, id`, id)
	if err != nil {
		return nil, fmt.Errorf("recovery: attempts: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Attempt, error) {
		var a Attempt
		err := r.Scan(&a.ID, &a.Attempt, &a.LeaseToken, &a.StartedAt, &a.FinishedAt, &a.Outcome, &a.HTTPStatus,
			&a.StripeRequestID, &a.ErrorCode, &a.ErrorMessage)
		a.StartedAt = a.StartedAt.UTC()
		if a.FinishedAt != nil {
			f := a.FinishedAt.UTC()
			a.FinishedAt = &f
		}
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("recovery: attempts: %w", err)
	}
	if out == nil {
		out = []Attempt{}
	}
	return out, nil
}

// Get returns the item with id as it is now. Errors: ErrNotFound.
func (s *Service) Get(ctx context.Context, id int64) (outbox.Row, error) {
	return getItem(ctx, s.db, id, false)
}
