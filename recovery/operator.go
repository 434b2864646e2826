package recovery

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// OperatorAction is an audited operator change that concerns no outbox
// item (settings, tables an operator maintains): one recovery_actions row
// with item_id NULL, the change in subject and what it replaced in
// observed.
type OperatorAction struct {
	Action   string // e.g. "usage_configure", "inbox_plan_set"
	Actor    string // required
	Reason   string // required
	Evidence string // optional
	Subject  any    // the change, JSON-encoded
	Observed any    // what was there before, JSON-encoded (nil = {})
}

// RecordOperatorAction writes a in tx, so the audit row commits or rolls
// back with the change it describes, and returns its id. ErrInvalidActor
// or ErrInvalidReason when they are blank.
func RecordOperatorAction(ctx context.Context, tx pgx.Tx, a OperatorAction) (int64, error) {
	switch {
	case strings.TrimSpace(a.Actor) == "":
		return 0, fmt.Errorf("%w: say who is acting", ErrInvalidActor)
	case strings.TrimSpace(a.Reason) == "":
		return 0, fmt.Errorf("%w: say why", ErrInvalidReason)
	case strings.TrimSpace(a.Action) == "":
		return 0, fmt.Errorf("recovery: operator action: the action name is required")
	}
	subject, err := json.Marshal(a.Subject)
	if err != nil {
		return 0, fmt.Errorf("recovery: operator action: encode subject: %w", err)
	}
	observed := []byte("{}")
	if a.Observed != nil {
		if observed, err = json.Marshal(a.Observed); err != nil {
			return 0, fmt.Errorf("recovery: operator action: encode observed: %w", err)
		}
	}
	var id int64
	err = tx.QueryRow(ctx, `
		INSERT INTO recovery_actions (item_id, action, actor, reason, evidence, observed, applied, subject)
		VALUES (NULL, $1, $2, $3, $4, $5::jsonb, true, $6::jsonb) RETURNING id`,
		a.Action, a.Actor, a.Reason, a.Evidence, string(observed), string(subject)).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("recovery: operator action %s: %w", a.Action, err)
	}
	return id, nil
}
