package recovery

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/aurora-billing/aurora/shared/usage"
	"github.com/jackc/pgx/v5"
)

// LinkKind names the usage fact that staged an item.
type LinkKind string

const (
	// LinkUsageWindow: usage_windows.staged_item_id points at the item (a
	// buffered window, subject kind usage_window).
	LinkUsageWindow LinkKind = "usage_window"
	// LinkUsageEvent: usage_events.item_id points at the item (a durable
	// event or correction).
	LinkUsageEvent LinkKind = "usage_event"
)

// Link is the staged link of an item: the usage fact whose current item it
// is. Abandon clears it so the fact restages under a new identity.
type Link struct {
	Kind   LinkKind `json:"kind"`
	Tenant string   `json:"tenant"`
	// usage_window
	Feature        string     `json:"feature,omitempty"`
	PeriodStart    *time.Time `json:"period_start,omitempty"`
	AcknowledgedTo *int64     `json:"acknowledged_to,omitempty"`
	Generation     *int       `json:"generation,omitempty"`
	// usage_event
	EventID string `json:"event_id,omitempty"`
}

var generationSuffix = regexp.MustCompile(`^(.*):r[1-9][0-9]*$`)

// findLink returns the fact that still points at row, or nil. Lookups go
// through the primary keys: (tenant, feature, period_start) for windows,
// (tenant, event_id) for events, with the event id taken from the
// subject_ref (with and without a ":r<g>" suffix).
func findLink(ctx context.Context, q outbox.Querier, row outbox.Row, lock bool) (*Link, error) {
	forUpdate := ""
	if lock {
		forUpdate = " FOR UPDATE"
	}
	switch row.SubjectKind {
	case identity.SubjectUsageWindow:
		var ackTo int64
		var gen int
		err := q.QueryRow(ctx, `
			SELECT acknowledged_to, generation FROM usage_windows
			WHERE tenant = $1 AND feature = $2 AND period_start = $3 AND staged_item_id = $4`+forUpdate,
			row.Tenant, row.Feature, row.PeriodStart, row.ID).Scan(&ackTo, &gen)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("recovery: window link: %w", err)
		}
		ps := row.PeriodStart.UTC()
		return &Link{Kind: LinkUsageWindow, Tenant: row.Tenant, Feature: row.Feature, PeriodStart: &ps, AcknowledgedTo: &ackTo, Generation: &gen}, nil
	case identity.SubjectEvent, identity.SubjectCorrection:
		rest, ok := strings.CutPrefix(row.SubjectRef, string(row.SubjectKind)+":")
		if !ok {
			return nil, nil
		}
		candidates := []string{rest}
		if m := generationSuffix.FindStringSubmatch(rest); m != nil {
			candidates = append(candidates, m[1])
		}
		var eventID string
		err := q.QueryRow(ctx, `
			SELECT event_id FROM usage_events
			WHERE tenant = $1 AND event_id = ANY($2) AND kind = $3 AND item_id = $4
			ORDER BY length(event_id) DESC LIMIT 1`+forUpdate,
			row.Tenant, candidates, string(row.SubjectKind), row.ID).Scan(&eventID)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("recovery: event link: %w", err)
		}
		return &Link{Kind: LinkUsageEvent, Tenant: row.Tenant, EventID: eventID}, nil
	default:
		return nil, fmt.Errorf("recovery: item %d has unknown subject kind %q", row.ID, string(row.SubjectKind))
	}
}

// maxRestageProbe bounds the search for a free generation when restaging an
// event (a generation is skipped only when another event's id happens to
// end in ":r<g>").
const maxRestageProbe = 100

// planEventRestage returns the identity an abandoned event item restages
// under: "<kind>:<event_id>:r<g>" with g one past the abandoned item's
// generation, skipping generations whose key is already taken.
func planEventRestage(ctx context.Context, q outbox.Querier, row outbox.Row, link *Link) (*Restage, error) {
	base := string(row.SubjectKind) + ":" + link.EventID
	g, ok := usage.EventGeneration(row.SubjectRef, base)
	if !ok {
		g = 0
	}
	version, err := currentMappingVersion(ctx, q, row)
	if err != nil {
		return nil, err
	}
	for next := g + 1; next <= g+maxRestageProbe; next++ {
		ref := usage.WithGeneration(base, next)
		key := identity.Key(row.Tenant, row.SubjectKind, ref, row.DestinationAccount)
		var taken bool
		if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM outbox_items WHERE idempotency_key = $1)`, key).Scan(&taken); err != nil {
			return nil, fmt.Errorf("recovery: restage key: %w", err)
		}
		if !taken {
			return &Restage{EventID: link.EventID, Generation: next, SubjectRef: ref, IdempotencyKey: key, MappingVersion: version}, nil
		}
	}
	return nil, fmt.Errorf("recovery: item %d: no free restage generation in %d..%d", row.ID, g+1, g+maxRestageProbe)
}

// restageEvent stages the planned new item in tx and moves the event's link
// to it. The old item keeps its row, now rejected.
func restageEvent(ctx context.Context, tx pgx.Tx, row outbox.Row, r *Restage) (*outbox.Row, error) {
	id := row.Identity
	id.SubjectRef = r.SubjectRef
	id.MappingVersion = r.MappingVersion
	staged, err := outbox.Stage(ctx, tx, outbox.Item{
		Identity: id, Feature: row.Feature, Quantity: row.Quantity, OccurredAt: row.OccurredAt,
		PeriodStart: row.PeriodStart, Payload: row.Payload,
	})
	if err != nil {
		return nil, fmt.Errorf("recovery: restage event: %w", err)
	}
	if staged.IdempotencyKey != r.IdempotencyKey || staged.ID == row.ID || staged.State != outbox.StatePending {
		return nil, fmt.Errorf("recovery: restage event: item %d collapsed onto existing item %d", row.ID, staged.ID)
	}
	tag, err := tx.Exec(ctx, `UPDATE usage_events SET item_id = $4 WHERE tenant = $1 AND event_id = $2 AND item_id = $3`,
		row.Tenant, r.EventID, row.ID, staged.ID)
	if err != nil {
		return nil, fmt.Errorf("recovery: restage event: relink: %w", err)
	}
	if tag.RowsAffected() != 1 {
		return nil, fmt.Errorf("recovery: restage event: the link of item %d moved", row.ID)
	}
	r.ItemID = staged.ID
	return &staged, nil
}
