package usage

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/jackc/pgx/v5"
)

// EventError names the event of a batch that was refused: its position in
// the slice given to RecordBatch and its event id. It wraps the refusal
// (errors.Is and errors.As see ErrInvalidEvent, *FieldError,
// ErrEventConflict, ErrCorrectedUnknown, outbox.ErrPayloadConflict, …).
type EventError struct {
	Index   int    // position in the batch, from 0
	EventID string // the event's id (caller data: do not log it)
	Err     error  // the refusal, as Gate.Record returns it
}

func (e *EventError) Error() string {
	return fmt.Sprintf("usage: batch event %d: %v", e.Index, e.Err)
}

// Unwrap returns the refusal.
func (e *EventError) Unwrap() error { return e.Err }

// RecordBatch records events in tx on the staging path of Gate.Record
// (the package documentation lists its rules and their order), set-based:
// one round trip for the locks and lookups of the whole batch and one
// statement that stores every new plain event with its item, so a batch
// of 500 costs a handful of round trips instead of several per event. It
// returns how many events were newly recorded (an idempotent repeat is
// not counted).
//
// Plain events are staged before corrections, so a correction may name an
// event anywhere in the same batch; corrections are then checked and
// staged one at a time, in order. The first event refused (a validation
// error, a conflict, a refused correction: the errors of Gate.Record) ends
// the call with *EventError naming it; tx then holds part of the batch and
// the caller rolls it back. To keep the rest, the caller records the
// other events again (the demo and `aurora usage import` replay the batch
// one event per transaction and report the refused ones). Database errors
// are returned as they are.
func (g Gate) RecordBatch(ctx context.Context, tx pgx.Tx, events []Event) (created int, err error) {
	res, err := g.path().stage(ctx, tx, events)
	if err != nil {
		return 0, err
	}
	for _, r := range res {
		if r.created {
			created++
		}
	}
	return created, nil
}

// path is the one staging path of usage events. gated: the cutover lock,
// the watermark's era and the correction check apply (Gate); otherwise
// opts are given to every item (Recorder.Record).
type path struct {
	r       Recorder
	gated   bool
	sources Sources
	opts    []outbox.StageOption
}

func (g Gate) path() path { return path{r: g.Recorder, gated: true, sources: g.Sources} }

// staged is what the path did with one event.
type staged struct {
	item    int64 // the id of the event's item
	created bool  // the event was recorded now (not an idempotent repeat)
}

// planned is an event with everything decided before it is written.
type planned struct {
	index int
	ev    Event
	opts  []outbox.StageOption
	item  outbox.Prepared
}

// stage runs the staging rules (package documentation) on events in tx and
// returns what happened to each, in order. A refused event ends it with
// *EventError.
func (p path) stage(ctx context.Context, tx pgx.Tx, events []Event) ([]staged, error) {
	if len(events) == 0 {
		return nil, nil
	}
	refuse := func(i int, err error) error { return &EventError{Index: i, EventID: events[i].EventID, Err: err} }
	// 1. Every event is valid.
	for i, ev := range events {
		if err := ev.Validate(); err != nil {
			return nil, refuse(i, err)
		}
	}
	// 2. The cutover locks, watermarks and mapping versions of the batch.
	look, err := p.lookup(ctx, tx, events)
	if err != nil {
		return nil, err
	}
	// 3. Each event's item: its period, mapping version and era, checked
	// and completed by outbox.Prepare (the rules of outbox.Stage).
	plans := make([]planned, len(events))
	var plain, corrections []*planned
	for i, ev := range events {
		pl := &plans[i]
		pl.index, pl.ev, pl.opts = i, ev, p.opts
		start := p.r.period().Start(ev.OccurredAt)
		if p.gated {
			w, scheduled := look.watermark(ev.Tenant, ev.Feature)
			pl.opts = nil
			if EraOf(start, w, scheduled, p.sources.Of(ev.Feature)) == EraBuffered {
				pl.opts = []outbox.StageOption{outbox.WithQuarantine(outbox.ReasonPeriodBuffered)}
			}
		}
		pl.item, err = outbox.Prepare(p.r.item(ev, look.versions[ev.Feature], start), pl.opts...)
		if err != nil {
			return nil, refuse(i, err)
		}
		if ev.CorrectsEventID != "" {
			corrections = append(corrections, pl)
		} else {
			plain = append(plain, pl)
		}
	}
	out := make([]staged, len(events))
	// 4. Plain events, in one statement; 5. corrections, each checked
	// against what it corrects and then written the same way.
	if err := p.write(ctx, tx, plain, out); err != nil {
		return nil, err
	}
	for _, pl := range corrections {
		if p.gated {
			if err := CheckCorrection(ctx, tx, p.r.period(), pl.ev); err != nil {
				return nil, refuse(pl.index, err)
			}
		}
		if err := p.write(ctx, tx, []*planned{pl}, out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// item is the export item of ev: its identity on the recorder's
// destination at mapping version, its payload and the period starting at
// periodStart.
func (r Recorder) item(ev Event, version int32, periodStart time.Time) outbox.Item {
	return outbox.Item{
		Identity: identity.Identity{
			Tenant: ev.Tenant, SubjectKind: ev.Kind(), SubjectRef: SubjectRef(ev), Exporter: r.exporter(),
			DestinationAccount: r.DestinationAccount, Mode: r.Mode, MappingVersion: version,
		},
		Feature: ev.Feature, Quantity: ev.Quantity, OccurredAt: ev.OccurredAt, PeriodStart: periodStart,
	}
}

type tenantFeature struct{ tenant, feature string }

// lookups is what the batch's events need to know before they are written.
type lookups struct {
	marks    map[tenantFeature]time.Time // the cutover rows (tenant "" = every tenant)
	versions map[string]int32            // feature → mapping version on the destination (absent = 0)
}

// watermark returns the watermark governing (tenant, feature): the
// tenant's row, else the all-tenants row.
func (l lookups) watermark(tenant, feature string) (Watermark, bool) {
	at, ok := l.marks[tenantFeature{tenant, feature}]
	if !ok {
		at, ok = l.marks[tenantFeature{"", feature}]
	}
	return Watermark{At: at}, ok
}

// lookup reads, in one round trip: (gated) the shared cutover lock of
// every feature of events, in a stable order, then their watermark rows
// for the events' tenants and all tenants (read after the locks are
// granted, so no schedule moves them before tx ends); and the mapping
// versions of the features on the destination.
func (p path) lookup(ctx context.Context, tx pgx.Tx, events []Event) (l lookups, err error) {
	fs, ts := map[string]bool{}, map[string]bool{}
	for _, ev := range events {
		fs[ev.Feature], ts[ev.Tenant] = true, true
	}
	feats, tenants := sortedKeys(fs), sortedKeys(ts)
	l = lookups{marks: map[tenantFeature]time.Time{}, versions: map[string]int32{}}
	b := &pgx.Batch{}
	if p.gated {
		b.Queue(`SELECT pg_advisory_xact_lock_shared(hashtextextended('aurora.usage_cutover:' || f, 0)) FROM unnest($1::text[]) AS f`, feats)
		b.Queue(`SELECT tenant, feature, watermark FROM usage_cutovers WHERE feature = ANY($1) AND (tenant = '' OR tenant = ANY($2))`,
			feats, tenants)
	}
	b.Queue(`SELECT feature, mapping_version FROM meter_mappings WHERE destination_account = $1 AND feature = ANY($2)`,
		p.r.DestinationAccount, feats)
	br := tx.SendBatch(ctx, b)
	defer func() {
		if cerr := br.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("usage: lookups: %w", cerr)
		}
	}()
	if p.gated {
		if _, err := br.Exec(); err != nil {
			return l, fmt.Errorf("usage: lock cutovers: %w", err)
		}
		rows, err := br.Query()
		if err != nil {
			return l, fmt.Errorf("usage: watermarks: %w", err)
		}
		var k tenantFeature
		var at time.Time
		if _, err := pgx.ForEachRow(rows, []any{&k.tenant, &k.feature, &at}, func() error {
			l.marks[k] = at.UTC()
			return nil
		}); err != nil {
			return l, fmt.Errorf("usage: watermarks: %w", err)
		}
	}
	rows, err := br.Query()
	if err != nil {
		return l, fmt.Errorf("usage: mapping versions: %w", err)
	}
	var f string
	var v int32
	if _, err := pgx.ForEachRow(rows, []any{&f, &v}, func() error {
		l.versions[f] = v
		return nil
	}); err != nil {
		return l, fmt.Errorf("usage: mapping versions: %w", err)
	}
	return l, nil
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// write stores the planned events and their items in tx and fills out at
// their indexes.
//
// One statement stores the new usage events, each already linked to the
// item it inserts for it (only for them: an event recorded before keeps its
// item). The items' ids come from the identity sequence first, so no
// second write links them (migration 00013); the columns written are
// exactly outbox.Prepare's. The link is checked at the end of write
// (deferred, then set back to immediate): an item insert that finds its
// identity taken (an item staged by hand) leaves its event pointing at an
// id that was never used, repaired before then by outbox.Stage (which
// collapses onto that item or reports the payload conflict) and a link.
//
// An event that was not inserted (recorded before, or a second copy in the
// same call) is an idempotent repeat when its content is the same
// (created = false, its item), else ErrEventConflict; one recorded without
// an item gets its item now.
func (p path) write(ctx context.Context, tx pgx.Tx, plans []*planned, out []staged) error {
	if len(plans) == 0 {
		return nil
	}
	n := len(plans)
	tenants, ids, kinds, features, refs := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	corrects := make([]*string, n)
	quantities, versions := make([]int64, n), make([]int32, n)
	occurred, periods := make([]time.Time, n), make([]time.Time, n)
	states, reasons := make([]string, n), make([]*string, n)
	for i, pl := range plans {
		it := pl.item
		tenants[i], ids[i], kinds[i], features[i], refs[i] = it.Tenant, pl.ev.EventID, string(it.SubjectKind), it.Feature, it.SubjectRef
		if pl.ev.CorrectsEventID != "" {
			corrects[i] = &pl.ev.CorrectsEventID
		}
		quantities[i], versions[i] = it.Quantity, it.MappingVersion
		occurred[i], periods[i] = it.OccurredAt, it.PeriodStart
		states[i], reasons[i] = string(pl.item.State), pl.item.Reason
	}
	b := &pgx.Batch{}
	b.Queue(`SET CONSTRAINTS usage_events_item_id_fkey DEFERRED`)
	b.Queue(`
		WITH ev AS MATERIALIZED (
			SELECT e.*, nextval((SELECT pg_get_serial_sequence('outbox_items', 'id'))::regclass) AS item_id
			FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::bigint[], $8::timestamptz[],
				$9::timestamptz[], $10::int[], $11::text[], $12::text[])
				AS e(tenant, event_id, kind, corrects_event_id, feature, subject_ref, quantity, occurred_at, period_start, mapping_version, state, reason)
		), ins_ev AS (
			INSERT INTO usage_events (tenant, event_id, kind, feature, quantity, occurred_at, corrects_event_id, item_id)
			SELECT tenant, event_id, kind, feature, quantity, occurred_at, corrects_event_id, item_id FROM ev
			ON CONFLICT (tenant, event_id) DO NOTHING
			RETURNING tenant, event_id, item_id
		), ins_item AS (
			INSERT INTO outbox_items (id, tenant, subject_kind, subject_ref, exporter, destination_account, mode, mapping_version,
				idempotency_key, feature, quantity, occurred_at, period_start, payload, state, quarantine_reason)
			OVERRIDING SYSTEM VALUE
			SELECT ev.item_id, ev.tenant, ev.kind, ev.subject_ref, $13, $14, $15, ev.mapping_version, '', ev.feature, ev.quantity,
				ev.occurred_at, ev.period_start, $16::jsonb, ev.state, ev.reason
			FROM ev JOIN ins_ev USING (tenant, event_id, item_id)
			ON CONFLICT ON CONSTRAINT outbox_items_identity_key DO NOTHING
			RETURNING id
		)
		SELECT e.tenant, e.event_id, e.item_id, i.id IS NOT NULL
		FROM ins_ev e LEFT JOIN ins_item i ON i.id = e.item_id`,
		tenants, ids, kinds, corrects, features, refs, quantities, occurred, periods, versions, states, reasons,
		plans[0].item.Exporter, plans[0].item.DestinationAccount, string(plans[0].item.Mode), []byte(plans[0].item.Payload))
	type key struct{ tenant, id string }
	type stored struct {
		item   int64 // the id the event was stored with
		staged bool  // an item was inserted with that id
	}
	inserted := map[key]stored{}
	br := tx.SendBatch(ctx, b)
	_, err := br.Exec()
	if err == nil {
		var rows pgx.Rows
		rows, err = br.Query()
		if err == nil {
			var k key
			var st stored
			_, err = pgx.ForEachRow(rows, []any{&k.tenant, &k.id, &st.item, &st.staged}, func() error {
				inserted[k] = st
				return nil
			})
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("usage: record: %w", err)
	}
	for _, pl := range plans {
		k := key{pl.ev.Tenant, pl.ev.EventID}
		st, ok := inserted[k]
		delete(inserted, k) // a second copy in the same call is a repeat
		var err error
		switch {
		case ok && st.staged:
			out[pl.index] = staged{item: st.item, created: true}
		case ok:
			// The event is new but its identity already has an item.
			out[pl.index], err = p.stageAndLink(ctx, tx, pl)
		default:
			out[pl.index], err = p.existing(ctx, tx, pl)
		}
		if err != nil {
			return err
		}
	}
	// Back to immediate: the check runs now, on every link of the call, so
	// a broken link fails here rather than at the caller's commit.
	if _, err := tx.Exec(ctx, `SET CONSTRAINTS usage_events_item_id_fkey IMMEDIATE`); err != nil {
		return fmt.Errorf("usage: record: link items: %w", err)
	}
	return nil
}

// stageAndLink stages pl's item with outbox.Stage (which collapses onto an
// existing identity or reports *outbox.PayloadConflictError) and links the
// event to it.
func (p path) stageAndLink(ctx context.Context, tx pgx.Tx, pl *planned) (staged, error) {
	row, err := outbox.Stage(ctx, tx, pl.item.Item, pl.opts...)
	if err != nil {
		var fe *outbox.FieldError
		if errors.Is(err, outbox.ErrPayloadConflict) || errors.As(err, &fe) {
			return staged{}, &EventError{Index: pl.index, EventID: pl.ev.EventID, Err: err}
		}
		return staged{}, err
	}
	if err := linkItem(ctx, tx, pl.ev, row.ID); err != nil {
		return staged{}, fmt.Errorf("usage: record: %w", err)
	}
	return staged{item: row.ID, created: true}, nil
}

// existing handles an event whose (tenant, event_id) was already recorded:
// the same content is a repeat (its item), different content
// ErrEventConflict; a record without an item gets it now.
func (p path) existing(ctx context.Context, tx pgx.Tx, pl *planned) (staged, error) {
	ev := pl.ev
	var corrects *string
	if ev.CorrectsEventID != "" {
		corrects = &ev.CorrectsEventID
	}
	var same bool
	var itemID *int64
	err := tx.QueryRow(ctx, `
		SELECT kind = $3 AND feature = $4 AND quantity = $5 AND occurred_at = $6 AND corrects_event_id IS NOT DISTINCT FROM $7, item_id
		FROM usage_events WHERE tenant = $1 AND event_id = $2`,
		ev.Tenant, ev.EventID, string(ev.Kind()), ev.Feature, ev.Quantity, ev.OccurredAt.UTC(), corrects).Scan(&same, &itemID)
	if err != nil {
		return staged{}, fmt.Errorf("usage: record: read existing: %w", err)
	}
	if !same {
		return staged{}, &EventError{Index: pl.index, EventID: ev.EventID,
			Err: fmt.Errorf("%w: tenant event %q was recorded with different content", ErrEventConflict, ev.EventID)}
	}
	if itemID != nil {
		return staged{item: *itemID}, nil
	}
	return p.stageAndLink(ctx, tx, pl)
}
