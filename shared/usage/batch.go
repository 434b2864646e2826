package usage

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/jackc/pgx/v5"
)

// RecordBatch records many events in tx with the same rules as Gate.Record,
// set-based: a handful of round trips for the whole batch instead of several
// per event. It returns how many events were newly recorded.
//
// Events that are not plain new events take the exact per-event path
// (Gate.Record): corrections (they are checked against what they correct),
// and any event whose id was already recorded (idempotent repeat, or
// ErrEventConflict). Validation errors are returned as by Gate.Record, and
// the first error aborts the batch (the caller rolls back tx).
func (g Gate) RecordBatch(ctx context.Context, tx pgx.Tx, events []Event) (created int, err error) {
	if len(events) == 0 {
		return 0, nil
	}
	var plain []Event
	var slow []Event
	for _, ev := range events {
		if err := ev.Validate(); err != nil {
			return 0, err
		}
		if ev.CorrectsEventID != "" {
			slow = append(slow, ev)
		} else {
			plain = append(plain, ev)
		}
	}
	// The shared cutover locks, in a stable order, then the watermarks and
	// mapping versions every event of the batch needs: three round trips.
	featureSet := map[string]bool{}
	for _, ev := range plain {
		featureSet[ev.Feature] = true
	}
	feats := make([]string, 0, len(featureSet))
	for f := range featureSet {
		feats = append(feats, f)
	}
	sort.Strings(feats)
	if len(feats) > 0 {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock_shared(hashtextextended('aurora.usage_cutover:' || f, 0)) FROM unnest($1::text[]) AS f`, feats); err != nil {
			return 0, fmt.Errorf("usage: lock cutovers: %w", err)
		}
	}
	type tf struct{ tenant, feature string }
	marks := map[tf]time.Time{}
	rows, err := tx.Query(ctx, `SELECT tenant, feature, watermark FROM usage_cutovers WHERE feature = ANY($1)`, feats)
	if err != nil {
		return 0, fmt.Errorf("usage: watermarks: %w", err)
	}
	for rows.Next() {
		var k tf
		var at time.Time
		if err := rows.Scan(&k.tenant, &k.feature, &at); err != nil {
			rows.Close()
			return 0, err
		}
		marks[k] = at.UTC()
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	versions := map[string]int32{}
	rows, err = tx.Query(ctx, `SELECT feature, mapping_version FROM meter_mappings WHERE destination_account = $1 AND feature = ANY($2)`, g.Recorder.DestinationAccount, feats)
	if err != nil {
		return 0, fmt.Errorf("usage: mapping versions: %w", err)
	}
	for rows.Next() {
		var f string
		var v int32
		if err := rows.Scan(&f, &v); err != nil {
			rows.Close()
			return 0, err
		}
		versions[f] = v
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}

	n := len(plain)
	tenants, ids, features, refs := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	quantities, versionsCol := make([]int64, n), make([]int32, n)
	occurred, periods := make([]time.Time, n), make([]time.Time, n)
	reasons := make([]*string, n)
	buffered := string(outbox.ReasonPeriodBuffered)
	p := g.Recorder.period()
	for i, ev := range plain {
		tenants[i], ids[i], features[i], refs[i] = ev.Tenant, ev.EventID, ev.Feature, SubjectRef(ev)
		quantities[i], versionsCol[i] = ev.Quantity, versions[ev.Feature]
		occurred[i], periods[i] = ev.OccurredAt.UTC(), p.Start(ev.OccurredAt)
		w, scheduled := marks[tf{ev.Tenant, ev.Feature}]
		if !scheduled {
			w, scheduled = marks[tf{"", ev.Feature}]
		}
		if EraOf(periods[i], Watermark{At: w}, scheduled, g.Sources.Of(ev.Feature)) == EraBuffered {
			reasons[i] = &buffered
		}
	}
	// One statement stores the new usage events, already linked to the item
	// staged for each of them (only for them: an event recorded before keeps
	// its item). The items' ids come from the identity sequence first, so no
	// second write links them (migration 00013). The link is checked at the
	// end of the batch (deferred, then set back to immediate below): an item
	// insert that finds its identity taken (an item staged by hand) leaves
	// its event pointing at an id that was never used, repaired before then.
	if _, err := tx.Exec(ctx, `SET CONSTRAINTS usage_events_item_id_fkey DEFERRED`); err != nil {
		return 0, fmt.Errorf("usage: record batch: %w", err)
	}
	rows, err = tx.Query(ctx, `
		WITH ev AS MATERIALIZED (
			SELECT e.*, nextval((SELECT pg_get_serial_sequence('outbox_items', 'id'))::regclass) AS item_id
			FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::timestamptz[], $7::timestamptz[], $8::int[], $9::text[])
				AS e(tenant, event_id, feature, subject_ref, quantity, occurred_at, period_start, mapping_version, reason)
		), ins_ev AS (
			INSERT INTO usage_events (tenant, event_id, kind, feature, quantity, occurred_at, item_id)
			SELECT tenant, event_id, 'event', feature, quantity, occurred_at, item_id FROM ev
			ON CONFLICT (tenant, event_id) DO NOTHING
			RETURNING tenant, event_id, item_id
		), ins_item AS (
			INSERT INTO outbox_items (id, tenant, subject_kind, subject_ref, exporter, destination_account, mode, mapping_version,
				idempotency_key, feature, quantity, occurred_at, period_start, payload, state, quarantine_reason)
			OVERRIDING SYSTEM VALUE
			SELECT ev.item_id, ev.tenant, 'event', ev.subject_ref, $10, $11, $12, ev.mapping_version, '', ev.feature, ev.quantity,
				ev.occurred_at, ev.period_start, '{}'::jsonb, CASE WHEN ev.reason IS NULL THEN 'pending' ELSE 'quarantined' END, ev.reason
			FROM ev JOIN ins_ev USING (tenant, event_id)
			ON CONFLICT ON CONSTRAINT outbox_items_identity_key DO NOTHING
			RETURNING id
		)
		SELECT e.tenant, e.event_id, e.item_id, i.id IS NOT NULL
		FROM ins_ev e LEFT JOIN ins_item i ON i.id = e.item_id`,
		tenants, ids, features, refs, quantities, occurred, periods, versionsCol, reasons,
		g.Recorder.exporter(), g.Recorder.DestinationAccount, string(g.Recorder.Mode))
	if err != nil {
		return 0, fmt.Errorf("usage: record batch: %w", err)
	}
	type key struct{ tenant, id string }
	type stored struct {
		item   int64 // the id the event was stored with
		staged bool  // an item was inserted with that id
	}
	inserted := map[key]stored{}
	for rows.Next() {
		var k key
		var st stored
		if err := rows.Scan(&k.tenant, &k.id, &st.item, &st.staged); err != nil {
			rows.Close()
			return 0, err
		}
		inserted[k] = st
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("usage: record batch: %w", err)
	}
	for i, ev := range plain {
		k := key{ev.Tenant, ev.EventID}
		st, ok := inserted[k]
		delete(inserted, k) // a second copy in the same batch takes the exact path
		switch {
		case !ok:
			// Recorded before (or twice in this batch): the exact path
			// returns its item or ErrEventConflict.
			slow = append(slow, ev)
		case !st.staged:
			// The event is new but its identity already has an item (for
			// instance staged by hand): Stage collapses onto it or reports
			// the payload conflict, and the event is linked to it.
			var opts []outbox.StageOption
			if reasons[i] != nil {
				opts = append(opts, outbox.WithQuarantine(outbox.ReasonPeriodBuffered))
			}
			row, err := outbox.Stage(ctx, tx, outbox.Item{
				Identity: identity.Identity{Tenant: ev.Tenant, SubjectKind: identity.SubjectEvent, SubjectRef: refs[i],
					Exporter: g.Recorder.exporter(), DestinationAccount: g.Recorder.DestinationAccount, Mode: g.Recorder.Mode, MappingVersion: versionsCol[i]},
				Feature: ev.Feature, Quantity: ev.Quantity, OccurredAt: ev.OccurredAt, PeriodStart: periods[i],
			}, opts...)
			if err != nil {
				return 0, err
			}
			if err := linkItem(ctx, tx, ev, row.ID); err != nil {
				return 0, fmt.Errorf("usage: record batch: %w", err)
			}
			created++
		default:
			created++
		}
	}
	// Back to immediate: the check runs now, on every link of the batch,
	// so a broken link fails here rather than at the caller's commit.
	if _, err := tx.Exec(ctx, `SET CONSTRAINTS usage_events_item_id_fkey IMMEDIATE`); err != nil {
		return 0, fmt.Errorf("usage: record batch: link items: %w", err)
	}
	for _, ev := range slow {
		_, isNew, err := g.Record(ctx, tx, ev)
		if err != nil {
			return 0, err
		}
		if isNew {
			created++
		}
	}
	return created, nil
}
