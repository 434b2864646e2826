package recovery

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/jackc/pgx/v5"
)

// Kind names a recovery action (recovery_actions.action).
type Kind string

const (
	// KindAcknowledge: uncertain → accepted, with evidence that the
	// provider has the item.
	KindAcknowledge Kind = "acknowledge"
	// KindAbandon: uncertain → rejected, with evidence that the provider
	// does not have it; the subject restages under a new identity.
	KindAbandon Kind = "abandon"
	// KindRequeue: quarantined → pending, after the cause was fixed.
	KindRequeue Kind = "requeue"
)

// Action is one recovery_actions row: one operator call, applied or
// refused.
type Action struct {
	ID       int64  `json:"id"`
	ItemID   int64  `json:"item_id"`
	Action   Kind   `json:"action"`
	Actor    string `json:"actor"`
	Reason   string `json:"reason"`
	Evidence string `json:"evidence"`
	// Expected is the expected-state map the caller sent (see Expected).
	Expected json.RawMessage `json:"expected"`
	// Observed is the row as the call saw it when deciding (see Snapshot).
	Observed json.RawMessage `json:"observed"`
	Applied  bool            `json:"applied"`
	// Refusal is the refusal atom when not applied (e.g.
	// expected_state_mismatch), nil when applied.
	Refusal *Refusal `json:"refusal"`
	// Subject names the item and, when applied, the change made:
	// {"item_id", "idempotency_key", "change"}.
	Subject   json.RawMessage `json:"subject"`
	CreatedAt time.Time       `json:"created_at"`
}

// Change is what an applied call does (or, in a Preview, would do).
type Change struct {
	Action Kind         `json:"action"`
	ItemID int64        `json:"item_id"`
	From   outbox.State `json:"from"`
	To     outbox.State `json:"to"`
	// ProviderRef is stored on the row (acknowledge, when given).
	ProviderRef *string `json:"provider_ref,omitempty"`
	// ClearQuarantineReason is the reason requeue clears.
	ClearQuarantineReason *outbox.Reason `json:"clear_quarantine_reason,omitempty"`
	// Dispatch is the item's new dispatch number (requeue): the relay
	// publishes it again, next_attempt_at becomes now.
	Dispatch *int32 `json:"dispatch,omitempty"`
	// Window is the change to the usage window linked to the item.
	Window *WindowChange `json:"window,omitempty"`
	// Restage is the new item an abandoned event or correction is restaged
	// as.
	Restage *Restage `json:"restage,omitempty"`
	// Rebuild is the item a restage stages for the current mapping version
	// (same idempotency key).
	Rebuild *Rebuild `json:"rebuild,omitempty"`
}

// WindowChange is the change to usage_windows when an item linked from it
// is acknowledged (the ledger advances to the window's upper bound) or
// abandoned (the generation increments).
type WindowChange struct {
	Tenant             string    `json:"tenant"`
	Feature            string    `json:"feature"`
	PeriodStart        time.Time `json:"period_start"`
	ClearStagedItemID  int64     `json:"clear_staged_item_id"`
	GenerationFrom     int       `json:"generation_from"`
	GenerationTo       int       `json:"generation_to"`
	AcknowledgedToFrom int64     `json:"acknowledged_to_from"`
	AcknowledgedToTo   int64     `json:"acknowledged_to_to"`
	// SameBoundsSubjectRef and SameBoundsKey (abandon) are the identity the
	// buffered reporter restages the window under if its bounds have not
	// changed: usage.WindowSubjectRef with the new generation.
	SameBoundsSubjectRef string `json:"same_bounds_subject_ref,omitempty"`
	SameBoundsKey        string `json:"same_bounds_idempotency_key,omitempty"`
}

// Restage is the new item an abandoned durable event or correction is
// restaged as, in the same transaction: subject_ref "<kind>:<event_id>:r<g>",
// a new idempotency key, the feature's current mapping version.
type Restage struct {
	EventID        string `json:"event_id"`
	Generation     int    `json:"generation"`
	SubjectRef     string `json:"subject_ref"`
	IdempotencyKey string `json:"idempotency_key"`
	MappingVersion int32  `json:"mapping_version"`
	// ItemID is the new item's id once staged (0 in a Preview).
	ItemID int64 `json:"item_id,omitempty"`
}

// Result is the outcome of an applied or refused call.
type Result struct {
	// Item is the row after the call when applied, and as observed when
	// refused.
	Item outbox.Row
	// Action is the recovery_actions row written.
	Action Action
	// Change is what was done; nil when refused.
	Change *Change
	// Restaged is the new item of an abandoned event or correction.
	Restaged *outbox.Row
}

// Preview is what a call would do, computed without writing anything
// (auroractl's default, without --yes).
type Preview struct {
	Item     outbox.Row `json:"item"`
	Expected Expected   `json:"expected"`
	Change   Change     `json:"change"`
}

// input is what every write call carries.
type input struct {
	Expected Expected
	Reason   string
	Evidence string
	Actor    string
}

// spec is one kind of call: where it starts and ends, and its own rules.
type spec struct {
	kind            Kind
	from, to        outbox.State
	requireEvidence bool
	in              input
	// check runs after the expected-state comparison and returns a refusal
	// error (or a failure); it may add to the snapshot.
	check func(ctx context.Context, q outbox.Querier, row outbox.Row, obs *Snapshot) error
	// plan computes the change; lock says the call will apply it.
	plan func(ctx context.Context, q outbox.Querier, row outbox.Row, lock bool) (Change, error)
	// execute applies the change in tx; any error rolls everything back.
	execute func(ctx context.Context, tx pgx.Tx, row outbox.Row, c *Change) (*outbox.Row, error)
}

func (sp spec) validate() error {
	switch {
	case strings.TrimSpace(sp.in.Actor) == "":
		return fmt.Errorf("%w: say who is acting", ErrInvalidActor)
	case strings.TrimSpace(sp.in.Reason) == "":
		return fmt.Errorf("%w: say why", ErrInvalidReason)
	case sp.requireEvidence && strings.TrimSpace(sp.in.Evidence) == "":
		return fmt.Errorf("%w: say what you found at the provider", ErrInvalidEvidence)
	}
	return sp.in.Expected.validate(sp.from)
}

// decide runs every refusal rule against row: input validation, the
// expected-state comparison, the call's own check.
func (sp spec) decide(ctx context.Context, q outbox.Querier, row outbox.Row, obs *Snapshot) error {
	if err := sp.validate(); err != nil {
		return err
	}
	if fields := sp.in.Expected.diff(row); len(fields) > 0 {
		return &ExpectedStateMismatchError{ItemID: row.ID, Expected: sp.in.Expected, Current: row, Fields: fields}
	}
	if sp.check != nil {
		return sp.check(ctx, q, row, obs)
	}
	return nil
}

// unattributed is recorded as the actor of a call refused for a blank actor
// (recovery_actions.actor must not be empty).
const unattributed = "(none)"

// run performs one call: lock the row, decide, then either record the
// refusal and commit nothing else, or apply the change and record it in the
// same transaction.
func (s *Service) run(ctx context.Context, id int64, sp spec) (Result, error) {
	tx, err := s.db.BeginTx(ctx, pgx.TxOptions{})
	if err != nil {
		return Result{}, fmt.Errorf("recovery: %s: %w", sp.kind, err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit it is a no-op
	row, err := getItem(ctx, tx, id, true)
	if err != nil {
		return Result{}, err
	}
	obs := Observe(row)
	if err := sp.decide(ctx, tx, row, &obs); err != nil {
		refusal := RefusalOf(err)
		if refusal == "" {
			return Result{}, err
		}
		// The transaction has changed nothing; committing it persists the
		// refusal alone.
		action, rerr := s.record(ctx, tx, row, sp, obs, nil, refusal)
		if rerr != nil {
			return Result{}, rerr
		}
		if rerr := tx.Commit(ctx); rerr != nil {
			return Result{}, fmt.Errorf("recovery: %s: record refusal: %w", sp.kind, rerr)
		}
		return Result{Item: row, Action: action}, err
	}
	change, err := sp.plan(ctx, tx, row, true)
	if err != nil {
		return Result{}, err
	}
	restaged, err := sp.execute(ctx, tx, row, &change)
	if err != nil {
		return Result{}, err
	}
	after, err := getItem(ctx, tx, id, false)
	if err != nil {
		return Result{}, err
	}
	action, err := s.record(ctx, tx, row, sp, obs, &change, "")
	if err != nil {
		return Result{}, err
	}
	if err := tx.Commit(ctx); err != nil {
		return Result{}, fmt.Errorf("recovery: %s: commit: %w", sp.kind, err)
	}
	return Result{Item: after, Action: action, Change: &change, Restaged: restaged}, nil
}

// preview decides and plans without writing: a read-only transaction, no
// row locks, nothing recorded.
func (s *Service) preview(ctx context.Context, id int64, sp spec) (Preview, error) {
	tx, err := s.db.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly, IsoLevel: pgx.RepeatableRead})
	if err != nil {
		return Preview{}, fmt.Errorf("recovery: %s: %w", sp.kind, err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read-only
	row, err := getItem(ctx, tx, id, false)
	if err != nil {
		return Preview{}, err
	}
	p := Preview{Item: row, Expected: sp.in.Expected}
	obs := Observe(row)
	if err := sp.decide(ctx, tx, row, &obs); err != nil {
		return p, err
	}
	if p.Change, err = sp.plan(ctx, tx, row, false); err != nil {
		return p, err
	}
	return p, nil
}

func (s *Service) record(ctx context.Context, tx pgx.Tx, row outbox.Row, sp spec, obs Snapshot, change *Change, refusal Refusal) (Action, error) {
	actor := sp.in.Actor
	if strings.TrimSpace(actor) == "" {
		actor = unattributed
	}
	expected, err := json.Marshal(sp.in.Expected)
	if err != nil {
		return Action{}, fmt.Errorf("recovery: encode expected: %w", err)
	}
	observed, err := json.Marshal(obs)
	if err != nil {
		return Action{}, fmt.Errorf("recovery: encode observed: %w", err)
	}
	subject, err := json.Marshal(struct {
		ItemID         int64   `json:"item_id"`
		IdempotencyKey string  `json:"idempotency_key"`
		Change         *Change `json:"change,omitempty"`
	}{row.ID, row.IdempotencyKey, change})
	if err != nil {
		return Action{}, fmt.Errorf("recovery: encode subject: %w", err)
	}
	var ref *string
	if refusal != "" {
		r := string(refusal)
		ref = &r
	}
	a, err := scanAction(tx.QueryRow(ctx, `
		INSERT INTO recovery_actions (item_id, action, actor, reason, evidence, expected, observed, applied, refusal, subject, created_at)
		VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7::jsonb, $8, $9, $10::jsonb, coalesce($11::timestamptz, now()))
		RETURNING `+actionColumns,
		row.ID, string(sp.kind), actor, sp.in.Reason, sp.in.Evidence, string(expected), string(observed),
		refusal == "", ref, string(subject), s.clock.Override()))
	if err != nil {
		return Action{}, fmt.Errorf("recovery: %s: record action: %w", sp.kind, err)
	}
	return a, nil
}

const actionColumns = `id, coalesce(item_id, 0), action, actor, reason, evidence, expected, observed, applied, refusal, subject, created_at`

func scanAction(r pgx.Row) (Action, error) {
	var a Action
	var kind string
	var refusal *string
	if err := r.Scan(&a.ID, &a.ItemID, &kind, &a.Actor, &a.Reason, &a.Evidence, &a.Expected, &a.Observed,
		&a.Applied, &refusal, &a.Subject, &a.CreatedAt); err != nil {
		return Action{}, err
	}
	a.Action = Kind(kind)
	a.CreatedAt = a.CreatedAt.UTC()
	if refusal != nil {
		r := Refusal(*refusal)
		a.Refusal = &r
	}
	return a, nil
}

func actions(ctx context.Context, q outbox.Querier, id int64) ([]Action, error) {
	rows, err := q.Query(ctx, `SELECT `+actionColumns+` FROM recovery_actions WHERE item_id = $1 ORDER BY id`, id)
	if err != nil {
		return nil, fmt.Errorf("recovery: actions: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Action, error) { return scanAction(r) })
	if err != nil {
		return nil, fmt.Errorf("recovery: actions: %w", err)
	}
	if out == nil {
		out = []Action{}
	}
	return out, nil
}
