package cutover

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/jackc/pgx/v5"
)

// Action is one recovery_actions row about a cutover: a reschedule call,
// applied or refused.
type Action struct {
	ID       int64           `json:"id"`
	Action   string          `json:"action"` // reschedule_cutover
	Actor    string          `json:"actor"`
	Reason   string          `json:"reason"`
	Evidence string          `json:"evidence"`
	Expected json.RawMessage `json:"expected"` // {watermark, version, requested_watermark}
	Observed json.RawMessage `json:"observed"` // {watermark, version} as the call found it
	Applied  bool            `json:"applied"`
	Refusal  *string         `json:"refusal"` // e.g. expected_state_mismatch; nil when applied
	Subject  json.RawMessage `json:"subject"` // {tenant, feature}
	At       time.Time       `json:"created_at"`
}

// Actions returns every recorded call about the cutover of (tenant,
// feature), oldest first (tenant "" = the all-tenants cutover).
func Actions(ctx context.Context, q outbox.Querier, tenant, feature string) ([]Action, error) {
	if strings.TrimSpace(feature) == "" {
		return nil, &FieldError{"feature", "must not be empty"}
	}
	rows, err := q.Query(ctx, `
		SELECT id, action, actor, reason, evidence, expected, observed, applied, refusal, subject, created_at
		FROM recovery_actions
		WHERE item_id IS NULL AND subject->>'feature' = $1 AND subject->>'tenant' = $2
		ORDER BY id`, feature, tenant)
	if err != nil {
		return nil, fmt.Errorf("cutover: actions: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Action, error) {
		var a Action
		err := r.Scan(&a.ID, &a.Action, &a.Actor, &a.Reason, &a.Evidence, &a.Expected, &a.Observed, &a.Applied, &a.Refusal, &a.Subject, &a.At)
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("cutover: actions: %w", err)
	}
	return out, nil
}
