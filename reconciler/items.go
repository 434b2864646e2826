package reconciler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is what the reconciler needs of a pgx pool (satisfied by
// *pgxpool.Pool).
type DB interface {
	Querier
	Begin(ctx context.Context) (pgx.Tx, error)
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// Querier runs statements (a pool, a connection or a transaction).
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Finding is one difference a run found, before it is stored as an Item.
type Finding struct {
	Kind Kind `json:"kind"`
	// Fingerprint names the difference: its kind and its subject (an hour
	// window, an item, an invoice line). The same fingerprint found again
	// updates the stored item instead of adding one.
	Fingerprint string     `json:"-"`
	Tenant      string     `json:"tenant"`
	Feature     string     `json:"feature"`
	Account     string     `json:"destination_account"`
	MeterID     string     `json:"meter_id"`
	PeriodStart *time.Time `json:"period_start"`
	PeriodEnd   *time.Time `json:"period_end"`
	// Expected and Observed are quantities in units of the feature (nil
	// when the kind has none).
	Expected *float64 `json:"expected"`
	Observed *float64 `json:"observed"`
	// Detail says what was compared and what to look at, without customer
	// ids or payloads.
	Detail string `json:"detail"`
	// ItemIDs are the outbox items involved, ascending.
	ItemIDs []int64 `json:"item_ids"`
}

// Item is a stored reconciliation item.
type Item struct {
	ID int64 `json:"id"`
	Finding
	State             State      `json:"state"`
	FirstSeenAt       time.Time  `json:"first_seen_at"`
	LastSeenAt        time.Time  `json:"last_seen_at"`
	ObservedChangedAt *time.Time `json:"observed_changed_at"`
	Resolution        *string    `json:"resolution"`
	ResolvedBy        *string    `json:"resolved_by"`
	ResolvedAt        *time.Time `json:"resolved_at"`
}

// Limits of ListItems.
const (
	DefaultLimit = 100
	MaxLimit     = 1000
)

const itemColumns = `id, kind, fingerprint, state, tenant, feature, destination_account, meter_id, period_start, period_end,
	expected::float8, observed::float8, detail, outbox_item_ids, first_seen_at, last_seen_at, observed_changed_at,
	resolution, resolved_by, resolved_at`

func scanItem(r pgx.Row) (Item, error) {
	var it Item
	var kind, state string
	if err := r.Scan(&it.ID, &kind, &it.Fingerprint, &state, &it.Tenant, &it.Feature, &it.Account, &it.MeterID,
		&it.PeriodStart, &it.PeriodEnd, &it.Expected, &it.Observed, &it.Detail, &it.ItemIDs, &it.FirstSeenAt, &it.LastSeenAt,
		&it.ObservedChangedAt, &it.Resolution, &it.ResolvedBy, &it.ResolvedAt); err != nil {
		return Item{}, err
	}
	it.Kind, it.State = Kind(kind), State(state)
	if it.ItemIDs == nil {
		it.ItemIDs = []int64{}
	}
	return it, nil
}

// ListItems returns items in state (open or resolved; "" means open),
// oldest first, at most limit (1..MaxLimit). A bad state or limit is
// ErrInvalidQuery. Seed 000: list_items(state: "open", limit: 100).
func ListItems(ctx context.Context, q Querier, state State, limit int) ([]Item, error) {
	if state == "" {
		state = StateOpen
	}
	if state != StateOpen && state != StateResolved {
		return nil, fmt.Errorf("%w: state %q is not open or resolved", ErrInvalidQuery, state)
	}
	if limit < 1 || limit > MaxLimit {
		return nil, fmt.Errorf("%w: limit %d outside 1..%d", ErrInvalidQuery, limit, MaxLimit)
	}
	rows, err := q.Query(ctx, `SELECT `+itemColumns+` FROM reconciliation_items WHERE state = $1 ORDER BY first_seen_at, id LIMIT $2`, string(state), limit)
	if err != nil {
		return nil, fmt.Errorf("reconciler: list items: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Item, error) { return scanItem(r) })
	if err != nil {
		return nil, fmt.Errorf("reconciler: list items: %w", err)
	}
	if out == nil {
		out = []Item{}
	}
	return out, nil
}

// GetItem returns one item; ErrNotFound when there is none.
func GetItem(ctx context.Context, q Querier, id int64) (Item, error) {
	it, err := scanItem(q.QueryRow(ctx, `SELECT `+itemColumns+` FROM reconciliation_items WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Item{}, fmt.Errorf("%w: %d", ErrNotFound, id)
	}
	if err != nil {
		return Item{}, fmt.Errorf("reconciler: get item: %w", err)
	}
	return it, nil
}

// ItemsNaming returns every reconciliation item (open or resolved) that
// names outbox item id, oldest first.
func ItemsNaming(ctx context.Context, q Querier, outboxItemID int64) ([]Item, error) {
	rows, err := q.Query(ctx, `SELECT `+itemColumns+` FROM reconciliation_items WHERE outbox_item_ids @> ARRAY[$1::bigint] ORDER BY first_seen_at, id`, outboxItemID)
	if err != nil {
		return nil, fmt.Errorf("reconciler: items naming: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Item, error) { return scanItem(r) })
	if err != nil {
		return nil, fmt.Errorf("reconciler: items naming: %w", err)
	}
	if out == nil {
		out = []Item{}
	}
	return out, nil
}

// CountOpen returns the number of open items.
func CountOpen(ctx context.Context, q Querier) (int, error) {
	var n int
	if err := q.QueryRow(ctx, `SELECT count(*) FROM reconciliation_items WHERE state = 'open'`).Scan(&n); err != nil {
		return 0, fmt.Errorf("reconciler: count open items: %w", err)
	}
	return n, nil
}

// CountByKind returns the number of items per kind in state (every kind
// present, zeros included).
func CountByKind(ctx context.Context, q Querier, state State) (map[Kind]int, error) {
	rows, err := q.Query(ctx, `SELECT kind, count(*) FROM reconciliation_items WHERE state = $1 GROUP BY kind`, string(state))
	if err != nil {
		return nil, fmt.Errorf("reconciler: count by kind: %w", err)
	}
	out := make(map[Kind]int, len(Kinds))
	for _, k := range Kinds {
		out[k] = 0
	}
	var kind string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&kind, &n}, func() error { out[Kind(kind)] = n; return nil })
	if err != nil {
		return nil, fmt.Errorf("reconciler: count by kind: %w", err)
	}
	return out, nil
}

// upsertResult says what recording a finding did.
type upsertResult int

const (
	upsertInserted  upsertResult = iota + 1 // a new item
	upsertUpdated                           // an open item whose observation changed
	upsertUnchanged                         // the same difference again: nothing added
)

// record stores f: a new fingerprint inserts an open item; a known one
// updates an open item's expected, observed, detail, period end and item
// ids when any of them changed (observed_changed_at = now) and otherwise
// only its last_seen_at; a resolved item keeps what was resolved and only
// its last_seen_at moves. now nil means the database clock.
func record(ctx context.Context, tx pgx.Tx, f Finding, now *time.Time) (upsertResult, error) {
	ids := slices.Clone(f.ItemIDs)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	if ids == nil {
		ids = []int64{}
	}
	var (
		id                 int64
		state              string
		expected, observed *float64
		detail             string
		oldIDs             []int64
		periodEnd          *time.Time
	)
	err := tx.QueryRow(ctx, `SELECT id, state, expected::float8, observed::float8, detail, outbox_item_ids, period_end
		FROM reconciliation_items WHERE fingerprint = $1 FOR UPDATE`, f.Fingerprint).
		Scan(&id, &state, &expected, &observed, &detail, &oldIDs, &periodEnd)
	if errors.Is(err, pgx.ErrNoRows) {
		_, err = tx.Exec(ctx, `INSERT INTO reconciliation_items (kind, fingerprint, tenant, feature, destination_account, meter_id,
			period_start, period_end, expected, observed, detail, outbox_item_ids, first_seen_at, last_seen_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, coalesce($13::timestamptz, now()), coalesce($13::timestamptz, now()))
			ON CONFLICT (fingerprint) DO NOTHING`,
			string(f.Kind), f.Fingerprint, f.Tenant, f.Feature, f.Account, f.MeterID, f.PeriodStart, f.PeriodEnd,
			f.Expected, f.Observed, f.Detail, ids, now)
		if err != nil {
			return 0, fmt.Errorf("reconciler: record %s: %w", f.Kind, err)
		}
		return upsertInserted, nil
	}
	if err != nil {
		return 0, fmt.Errorf("reconciler: record %s: %w", f.Kind, err)
	}
	changed := !eqFloat(expected, f.Expected) || !eqFloat(observed, f.Observed) || detail != f.Detail ||
		!slices.Equal(oldIDs, ids) || !eqTime(periodEnd, f.PeriodEnd)
	if state != string(StateOpen) || !changed {
		if _, err := tx.Exec(ctx, `UPDATE reconciliation_items SET last_seen_at = coalesce($2::timestamptz, now()) WHERE id = $1`, id, now); err != nil {
			return 0, fmt.Errorf("reconciler: record %s: %w", f.Kind, err)
		}
		return upsertUnchanged, nil
	}
	_, err = tx.Exec(ctx, `UPDATE reconciliation_items SET expected = $2, observed = $3, detail = $4, outbox_item_ids = $5,
		period_end = $6, last_seen_at = coalesce($7::timestamptz, now()), observed_changed_at = coalesce($7::timestamptz, now())
		WHERE id = $1`, id, f.Expected, f.Observed, f.Detail, ids, f.PeriodEnd, now)
	if err != nil {
		return 0, fmt.Errorf("reconciler: record %s: %w", f.Kind, err)
	}
	return upsertUpdated, nil
}

func eqFloat(a, b *float64) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return *a == *b
}

func eqTime(a, b *time.Time) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return a.Equal(*b)
}

// ResolveInput is what a person states when resolving an item (seed 000:
// resolve_item(id, resolution, actor)).
type ResolveInput struct {
	// Resolution: what they did about the difference; non-blank.
	Resolution string `json:"resolution"`
	// Evidence: what they looked at (a credit note, an invoice id, a
	// search); optional, recorded as given.
	Evidence string `json:"evidence"`
	// Actor: who; non-blank.
	Actor string `json:"actor"`
}

// Resolution is the change a resolve makes: the item's state and its
// record of who and what. No counter, no outbox item, no credit moves.
type Resolution struct {
	ItemID     int64  `json:"item_id"`
	From       State  `json:"from"`
	To         State  `json:"to"`
	Resolution string `json:"resolution"`
	ResolvedBy string `json:"resolved_by"`
}

// ResolveResult is an applied or refused resolve.
type ResolveResult struct {
	// Item: after the call when applied, as observed when refused.
	Item Item `json:"item"`
	// ActionID is the recovery_actions row recorded (0 for a dry run).
	ActionID int64 `json:"action_id"`
	// Change is nil when refused.
	Change *Resolution `json:"change"`
}

// ActionResolve is the recovery_actions.action of a resolve.
const ActionResolve = "resolve_reconciliation_item"

// check is the refusal rules of a resolve: a non-blank resolution and
// actor, and an item that is still open.
func (in ResolveInput) check(it Item) error {
	switch {
	case strings.TrimSpace(in.Resolution) == "":
		return fmt.Errorf("%w: say what you did about the difference", ErrInvalidResolution)
	case strings.TrimSpace(in.Actor) == "":
		return fmt.Errorf("%w: say who is resolving", ErrInvalidActor)
	case it.State != StateOpen:
		return &AlreadyResolvedError{ID: it.ID, ResolvedBy: deref(it.ResolvedBy), Resolution: deref(it.Resolution)}
	}
	return nil
}

// plan is the change a resolve would make.
func (in ResolveInput) plan(it Item) Resolution {
	return Resolution{ItemID: it.ID, From: it.State, To: StateResolved, Resolution: in.Resolution, ResolvedBy: in.Actor}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// PreviewResolve checks and plans a resolve without writing anything (the
// dry run of `auroractl reconcile resolve` without --yes). Errors: as
// Resolve's, nothing recorded.
func PreviewResolve(ctx context.Context, q Querier, id int64, in ResolveInput) (ResolveResult, error) {
	it, err := GetItem(ctx, q, id)
	if err != nil {
		return ResolveResult{}, err
	}
	if err := in.check(it); err != nil {
		return ResolveResult{Item: it}, err
	}
	c := in.plan(it)
	return ResolveResult{Item: it, Change: &c}, nil
}

// Resolve records that a person looked at item id and what they did
// (seed 000, resolve_item): state open → resolved with resolution, actor
// and time. It changes nothing else: no counter, no outbox item, no credit.
// Every call on an existing item, applied or refused, writes one
// recovery_actions row (action resolve_reconciliation_item, item_id NULL,
// subject {"reconciliation_item_id": id}). Errors: ErrNotFound (nothing
// recorded), ErrInvalidResolution for a blank or whitespace resolution,
// ErrInvalidActor, *AlreadyResolvedError (each recorded as a refusal).
// now nil means the database clock.
func Resolve(ctx context.Context, db DB, id int64, in ResolveInput, now *time.Time) (ResolveResult, error) {
	tx, err := db.BeginTx(ctx, pgx.TxOptions{})
	if err != nil {
		return ResolveResult{}, fmt.Errorf("reconciler: resolve: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit it is a no-op
	it, err := scanItem(tx.QueryRow(ctx, `SELECT `+itemColumns+` FROM reconciliation_items WHERE id = $1 FOR UPDATE`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return ResolveResult{}, fmt.Errorf("%w: %d", ErrNotFound, id)
	}
	if err != nil {
		return ResolveResult{}, fmt.Errorf("reconciler: resolve: %w", err)
	}
	if cerr := in.check(it); cerr != nil {
		actionID, err := recordResolve(ctx, tx, it, in, nil, RefusalOf(cerr), now)
		if err != nil {
			return ResolveResult{}, err
		}
		if err := tx.Commit(ctx); err != nil {
			return ResolveResult{}, fmt.Errorf("reconciler: resolve: record refusal: %w", err)
		}
		return ResolveResult{Item: it, ActionID: actionID}, cerr
	}
	c := in.plan(it)
	tag, err := tx.Exec(ctx, `UPDATE reconciliation_items SET state = 'resolved', resolution = $2, resolved_by = $3,
		resolved_at = coalesce($4::timestamptz, now()) WHERE id = $1 AND state = 'open'`, id, in.Resolution, in.Actor, now)
	if err != nil {
		return ResolveResult{}, fmt.Errorf("reconciler: resolve: %w", err)
	}
	if tag.RowsAffected() != 1 {
		return ResolveResult{}, fmt.Errorf("reconciler: resolve: item %d changed under its lock", id)
	}
	actionID, err := recordResolve(ctx, tx, it, in, &c, "", now)
	if err != nil {
		return ResolveResult{}, err
	}
	after, err := scanItem(tx.QueryRow(ctx, `SELECT `+itemColumns+` FROM reconciliation_items WHERE id = $1`, id))
	if err != nil {
		return ResolveResult{}, fmt.Errorf("reconciler: resolve: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return ResolveResult{}, fmt.Errorf("reconciler: resolve: commit: %w", err)
	}
	return ResolveResult{Item: after, ActionID: actionID, Change: &c}, nil
}

// unattributed is recorded as the actor of a call refused for a blank
// actor (recovery_actions.actor must not be empty).
const unattributed = "(none)"

func recordResolve(ctx context.Context, tx pgx.Tx, it Item, in ResolveInput, c *Resolution, refusal Refusal, now *time.Time) (int64, error) {
	actor := in.Actor
	if strings.TrimSpace(actor) == "" {
		actor = unattributed
	}
	expected, _ := json.Marshal(map[string]any{"state": StateOpen})
	observed, err := json.Marshal(map[string]any{"state": it.State, "kind": it.Kind, "expected": it.Expected, "observed": it.Observed,
		"item_ids": it.ItemIDs, "resolved_by": it.ResolvedBy})
	if err != nil {
		return 0, fmt.Errorf("reconciler: resolve: encode observed: %w", err)
	}
	subject, err := json.Marshal(struct {
		ReconciliationItemID int64       `json:"reconciliation_item_id"`
		Change               *Resolution `json:"change,omitempty"`
	}{it.ID, c})
	if err != nil {
		return 0, fmt.Errorf("reconciler: resolve: encode subject: %w", err)
	}
	var ref *string
	if refusal != "" {
		r := string(refusal)
		ref = &r
	}
	var id int64
	err = tx.QueryRow(ctx, `INSERT INTO recovery_actions (item_id, action, actor, reason, evidence, expected, observed, applied, refusal, subject, created_at)
		VALUES (NULL, $1, $2, $3, $4, $5::jsonb, $6::jsonb, $7, $8, $9::jsonb, coalesce($10::timestamptz, now())) RETURNING id`,
		ActionResolve, actor, in.Resolution, in.Evidence, string(expected), string(observed), refusal == "", ref, string(subject), now).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("reconciler: resolve: record action: %w", err)
	}
	return id, nil
}
