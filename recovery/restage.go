package recovery

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/aurora-billing/aurora/shared/usage"
	"github.com/jackc/pgx/v5"
)

// KindRestage: quarantined → rejected, with a new pending item for the same
// work built for the feature's current mapping version, under the same
// idempotency key.
const KindRestage Kind = "restage"

// RestageInput is a restage: the feature was remapped (auroractl provision
// meter) and the operator rebuilds an item that was built for the mapping
// it replaced.
type RestageInput struct {
	// Expected is what the operator believes the row is; State must be
	// quarantined.
	Expected Expected
	Reason   string // why, e.g. "api_calls remapped to the v2 meter"; required
	Evidence string // what shows the new mapping is right, e.g. "provision meter: mtr_2 mapping_version 2"; required
	Actor    string // who; required
}

// Rebuild is the item a restage stages for the current mapping: the same
// tenant, subject and destination account, hence the same idempotency key
// (identity.Key leaves the mapping version out, so Stripe still
// deduplicates against anything the old item may have sent).
type Rebuild struct {
	SubjectRef         string `json:"subject_ref"`
	IdempotencyKey     string `json:"idempotency_key"`
	MappingVersionFrom int32  `json:"mapping_version_from"`
	MappingVersionTo   int32  `json:"mapping_version_to"`
	// Link is the usage fact whose link moves to the new item (nil: none
	// points at the old item).
	Link *Link `json:"link,omitempty"`
	// Dispatch is the new item's first dispatch: one past the old item's,
	// because the relay's Nats-Msg-Id is key.dispatch and the key is the
	// same (JetStream would drop dispatch 1 again as a duplicate).
	Dispatch int32 `json:"dispatch"`
	// ItemID is the new item's id once staged (0 in a Preview).
	ItemID int64 `json:"item_id,omitempty"`
}

// ErrMappingUnchanged: a restage of an item built for the feature's current
// mapping version. Nothing needs rebuilding: fix the cause and requeue it.
// The concrete error is *MappingUnchangedError.
var ErrMappingUnchanged = errors.New("recovery: mapping_unchanged")

// ErrNotMapped: a restage while the item's feature has no mapping on its
// destination account: there is no version to build for (auroractl
// provision meter first).
var ErrNotMapped = errors.New("recovery: not_mapped")

// ErrAlreadyRestaged: an item with the same identity for the current
// mapping version already exists (restaged before, or staged again by its
// producer). The concrete error is *AlreadyRestagedError naming it.
var ErrAlreadyRestaged = errors.New("recovery: already_restaged")

// Refusal atoms of a restage.
const (
	RefusalMappingUnchanged Refusal = "mapping_unchanged" // ErrMappingUnchanged
	RefusalNotMapped        Refusal = "not_mapped"        // ErrNotMapped
	RefusalAlreadyRestaged  Refusal = "already_restaged"  // ErrAlreadyRestaged
)

// MappingUnchangedError: the item was built for Version, which is current.
// It wraps ErrMappingUnchanged.
type MappingUnchangedError struct {
	ItemID  int64
	Version int32
}

func (e *MappingUnchangedError) Error() string {
	return fmt.Sprintf("recovery: mapping_unchanged: item %d was built for the current mapping version %d; requeue it instead", e.ItemID, e.Version)
}

// Unwrap returns ErrMappingUnchanged.
func (e *MappingUnchangedError) Unwrap() error { return ErrMappingUnchanged }

// AlreadyRestagedError: ExistingID already holds the item's identity for
// mapping version Version. It wraps ErrAlreadyRestaged.
type AlreadyRestagedError struct {
	ItemID     int64
	ExistingID int64
	Version    int32
}

func (e *AlreadyRestagedError) Error() string {
	return fmt.Sprintf("recovery: already_restaged: item %d's work exists for mapping version %d as item %d", e.ItemID, e.Version, e.ExistingID)
}

// Unwrap returns ErrAlreadyRestaged.
func (e *AlreadyRestagedError) Unwrap() error { return ErrAlreadyRestaged }

func restageRefusal(err error) Refusal {
	switch {
	case errors.Is(err, ErrMappingUnchanged):
		return RefusalMappingUnchanged
	case errors.Is(err, ErrNotMapped):
		return RefusalNotMapped
	case errors.Is(err, ErrAlreadyRestaged):
		return RefusalAlreadyRestaged
	}
	return ""
}

// stillBuffered is requeue's period_buffered rule, shared by restage: an
// item of a period the buffered counters still bill must stay quarantined.
func stillBuffered(ctx context.Context, q outbox.Querier, row outbox.Row, obs *Snapshot) error {
	if row.QuarantineReason == nil || *row.QuarantineReason != outbox.ReasonPeriodBuffered {
		return nil
	}
	w, scheduled, err := usage.WatermarkFor(ctx, q, row.Tenant, row.Feature)
	if err != nil {
		return err
	}
	var at *time.Time
	if scheduled {
		at = &w.At
	}
	obs.Watermark = at
	if usage.EraOf(row.PeriodStart, w, scheduled, usage.SourceCounters) == usage.EraBuffered {
		return &StillBufferedError{ItemID: row.ID, PeriodStart: row.PeriodStart, Watermark: at}
	}
	return nil
}

func (s *Service) restageSpec(in RestageInput) spec {
	return spec{
		kind: KindRestage, from: outbox.StateQuarantined, to: outbox.StateRejected, requireEvidence: true,
		in: input{Expected: in.Expected, Reason: in.Reason, Evidence: in.Evidence, Actor: in.Actor},
		check: func(ctx context.Context, q outbox.Querier, row outbox.Row, obs *Snapshot) error {
			current, err := currentMappingVersion(ctx, q, row)
			if err != nil {
				return err
			}
			obs.CurrentMappingVersion = &current
			switch {
			case current == 0:
				return fmt.Errorf("%w: feature %s has no meter mapping on %s", ErrNotMapped, row.Feature, row.DestinationAccount)
			case current == row.MappingVersion:
				return &MappingUnchangedError{ItemID: row.ID, Version: current}
			}
			var existing int64
			err = q.QueryRow(ctx, `SELECT id FROM outbox_items WHERE idempotency_key = $1 AND exporter = $2 AND mode = $3 AND mapping_version = $4`,
				row.IdempotencyKey, row.Exporter, string(row.Mode), current).Scan(&existing)
			switch {
			case err == nil:
				return &AlreadyRestagedError{ItemID: row.ID, ExistingID: existing, Version: current}
			case !errors.Is(err, pgx.ErrNoRows):
				return fmt.Errorf("recovery: restage: %w", err)
			}
			return stillBuffered(ctx, q, row, obs)
		},
		plan: func(ctx context.Context, q outbox.Querier, row outbox.Row, lock bool) (Change, error) {
			current, err := currentMappingVersion(ctx, q, row)
			if err != nil {
				return Change{}, err
			}
			link, err := findLink(ctx, q, row, lock)
			if err != nil {
				return Change{}, err
			}
			return Change{Action: KindRestage, ItemID: row.ID, From: outbox.StateQuarantined, To: outbox.StateRejected,
				ClearQuarantineReason: row.QuarantineReason,
				Rebuild: &Rebuild{SubjectRef: row.SubjectRef, IdempotencyKey: row.IdempotencyKey,
					MappingVersionFrom: row.MappingVersion, MappingVersionTo: current, Link: link, Dispatch: row.Dispatch + 1}}, nil
		},
		execute: func(ctx context.Context, tx pgx.Tx, row outbox.Row, c *Change) (*outbox.Row, error) {
			return rebuildItem(ctx, tx, row, c.Rebuild)
		},
	}
}

// rebuildItem stages the rebuilt item, moves the usage fact's link to it
// and retires the old item (rejected, last_error naming the new one).
func rebuildItem(ctx context.Context, tx pgx.Tx, row outbox.Row, r *Rebuild) (*outbox.Row, error) {
	id := row.Identity
	id.MappingVersion = r.MappingVersionTo
	staged, err := outbox.Stage(ctx, tx, outbox.Item{
		Identity: id, Feature: row.Feature, Quantity: row.Quantity, OccurredAt: row.OccurredAt,
		PeriodStart: row.PeriodStart, Payload: row.Payload,
	})
	if err != nil {
		return nil, fmt.Errorf("recovery: restage: %w", err)
	}
	if staged.IdempotencyKey != row.IdempotencyKey || staged.ID == row.ID || staged.State != outbox.StatePending || staged.MappingVersion != r.MappingVersionTo {
		return nil, fmt.Errorf("recovery: restage: item %d collapsed onto existing item %d", row.ID, staged.ID)
	}
	if _, err := tx.Exec(ctx, `UPDATE outbox_items SET dispatch = $2 WHERE id = $1`, staged.ID, r.Dispatch); err != nil {
		return nil, fmt.Errorf("recovery: restage: dispatch: %w", err)
	}
	staged.Dispatch = r.Dispatch
	if l := r.Link; l != nil {
		var tag interface{ RowsAffected() int64 }
		switch l.Kind {
		case LinkUsageEvent:
			tag, err = tx.Exec(ctx, `UPDATE usage_events SET item_id = $4 WHERE tenant = $1 AND event_id = $2 AND item_id = $3`,
				row.Tenant, l.EventID, row.ID, staged.ID)
		case LinkUsageWindow:
			tag, err = tx.Exec(ctx, `UPDATE usage_windows SET staged_item_id = $5, updated_at = now()
				WHERE tenant = $1 AND feature = $2 AND period_start = $3 AND staged_item_id = $4`,
				row.Tenant, row.Feature, row.PeriodStart, row.ID, staged.ID)
		default:
			return nil, fmt.Errorf("recovery: restage: unknown link kind %q", l.Kind)
		}
		if err != nil {
			return nil, fmt.Errorf("recovery: restage: relink: %w", err)
		}
		if tag.RowsAffected() != 1 {
			return nil, fmt.Errorf("recovery: restage: the link of item %d moved", row.ID)
		}
	}
	note := fmt.Sprintf("restaged as item %d for mapping_version %d (same idempotency key)", staged.ID, r.MappingVersionTo)
	ct, err := tx.Exec(ctx, `UPDATE outbox_items SET state = 'rejected', quarantine_reason = NULL, last_error = $2
		WHERE id = $1 AND state = 'quarantined'`, row.ID, note)
	if err != nil {
		return nil, fmt.Errorf("recovery: restage: retire item %d: %w", row.ID, err)
	}
	if ct.RowsAffected() != 1 {
		return nil, fmt.Errorf("recovery: restage: item %d left quarantined under its lock", row.ID)
	}
	r.ItemID = staged.ID
	return &staged, nil
}

// Restage rebuilds a quarantined item for its feature's current mapping
// version (seed 000, "Quarantine": an item built for a mapping that no
// longer exists cannot be requeued; the work is restaged for the current
// mapping). In one transaction:
//
//   - a new pending item is staged with the same tenant, subject kind,
//     subject ref, exporter, destination account, mode and payload and the
//     current mapping version — hence the same idempotency key, so Stripe
//     deduplicates against anything the old item sent; its dispatch starts
//     one past the old item's, so the relay's message (Nats-Msg-Id
//     key.dispatch) is not dropped as a duplicate of the old one's;
//   - the usage fact linking the old item (usage_events.item_id, or
//     usage_windows.staged_item_id) moves to the new one, so re-recording
//     the event returns the new item;
//   - the old item becomes rejected (quarantine reason cleared, last_error
//     naming the new item): nothing automatic leaves rejected, and it no
//     longer counts as quarantined.
//
// Refusals, recorded like every recovery call: the expected-state rules,
// a blank reason or evidence, *MappingUnchangedError (ErrMappingUnchanged:
// the item is built for the current version; requeue it), ErrNotMapped
// (the feature has no mapping now), *AlreadyRestagedError
// (ErrAlreadyRestaged), *StillBufferedError (a period_buffered item whose
// period the counters still bill). ErrNotFound records nothing.
func (s *Service) Restage(ctx context.Context, id int64, in RestageInput) (Result, error) {
	return s.run(ctx, id, s.restageSpec(in))
}

// PreviewRestage returns what Restage would do, with the same refusals,
// writing nothing.
func (s *Service) PreviewRestage(ctx context.Context, id int64, in RestageInput) (Preview, error) {
	return s.preview(ctx, id, s.restageSpec(in))
}

// RestageFilter selects quarantined items to restage.
type RestageFilter struct {
	// DestinationAccount and Feature name the remapped mapping; Feature is
	// required, DestinationAccount "" means every account.
	DestinationAccount string
	Feature            string
	// Reason filters by quarantine reason; "" = any.
	Reason outbox.Reason
	// Limit is 1..MaxLimit; 0 means DefaultLimit.
	Limit int
}

// Restageable returns quarantined items of f.Feature built for another
// mapping version than the feature's current one on their account (the
// candidates of Restage), oldest first. Errors: ErrInvalidQuery.
func (s *Service) Restageable(ctx context.Context, f RestageFilter) ([]outbox.Row, error) {
	if f.Limit == 0 {
		f.Limit = DefaultLimit
	}
	switch {
	case f.Feature == "":
		return nil, fmt.Errorf("%w: the feature is required", ErrInvalidQuery)
	case f.Limit < 1 || f.Limit > MaxLimit:
		return nil, fmt.Errorf("%w: limit %d outside 1..%d", ErrInvalidQuery, f.Limit, MaxLimit)
	case f.Reason != "" && !f.Reason.Valid():
		return nil, fmt.Errorf("%w: reason %q is not a quarantine reason", ErrInvalidQuery, string(f.Reason))
	}
	var account, reason *string
	if f.DestinationAccount != "" {
		account = &f.DestinationAccount
	}
	if f.Reason != "" {
		r := string(f.Reason)
		reason = &r
	}
	rows, err := s.db.Query(ctx, `
		SELECT `+outbox.Columns+` FROM outbox_items o
		WHERE o.state = 'quarantined' AND o.feature = $1
		  AND ($2::text IS NULL OR o.destination_account = $2)
		  AND ($3::text IS NULL OR o.quarantine_reason = $3)
		  AND o.mapping_version <> (SELECT m.mapping_version FROM meter_mappings m
		                            WHERE m.destination_account = o.destination_account AND m.feature = o.feature)
		ORDER BY o.updated_at, o.id
		LIMIT $4`, f.Feature, account, reason, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("recovery: restageable: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (outbox.Row, error) { return outbox.ScanRow(r) })
	if err != nil {
		return nil, fmt.Errorf("recovery: restageable: %w", err)
	}
	return out, nil
}
