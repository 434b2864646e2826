package reconciler

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/aurora-billing/aurora/shared/usage"
	"github.com/jackc/pgx/v5"
)

// DriftRule names which ledger position claims to have reported more than
// the counter it reported.
type DriftRule string

const (
	// DriftWindowAcknowledged: usage_windows.acknowledged_to (the counter
	// position acknowledged as reported) is above the period's
	// usage_counters.count (or the counter does not exist).
	DriftWindowAcknowledged DriftRule = "window_acknowledged_over_counter"
	// DriftWindowStaged: a staged window item that is not rejected covers
	// counter positions up to a bound above the period's counter.
	DriftWindowStaged DriftRule = "window_staged_over_counter"
	// DriftEventItem: a durable event's outbox item carries more than the
	// event recorded.
	DriftEventItem DriftRule = "event_item_over_event"
	// DriftEventTwice: a durable event or correction has more than one
	// accepted or confirmed item (restaged under a new identity while the
	// first had reached the provider): reported twice.
	DriftEventTwice DriftRule = "event_reported_twice"
)

// Drift is one ledger position that claims to have reported more than its
// counter: a physically impossible state.
type Drift struct {
	Rule        DriftRule `json:"rule"`
	Tenant      string    `json:"tenant"`
	Feature     string    `json:"feature"`
	PeriodStart time.Time `json:"period_start"`
	// Subject: the window's period, or the event id.
	Subject string `json:"subject"`
	// Reported: what the position claims was reported (units of the
	// feature, or items for event_reported_twice).
	Reported int64 `json:"reported"`
	// Counter: what the counter (or the recorded event) holds.
	Counter int64   `json:"counter"`
	ItemIDs []int64 `json:"item_ids"`
}

// BlindSpots are what Local cannot see (seed 000): it reads the local
// ledger only.
var BlindSpots = []string{
	"under-reporting: a counter above what was reported is normal backlog locally; only the provider's summaries show usage that never landed",
	"asynchronous rejections: Stripe answers 200 and rejects later; only its meter error reports and summaries show it",
	"invoices: nothing local says what Stripe billed; only finalized invoices do",
}

// LocalReport is the local check's answer (seed 000:
// %{local_drift: [...], items_open: 3}).
type LocalReport struct {
	LocalDrift []Drift `json:"local_drift"`
	// ItemsOpen is the number of open reconciliation items.
	ItemsOpen  int      `json:"items_open"`
	BlindSpots []string `json:"blind_spots"`
}

// Local is the local check (seed 000, "Reconciliation"): no network, and it
// mutates nothing (one read-only, repeatable-read transaction). It returns
// every ledger position — buffered counters and their usage windows, durable
// events and their items — that claims to have reported more than the
// counter it reported (DriftRule), and the number of open reconciliation
// items. It can see over-reporting only: see BlindSpots.
func Local(ctx context.Context, db DB) (LocalReport, error) {
	tx, err := db.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly, IsoLevel: pgx.RepeatableRead})
	if err != nil {
		return LocalReport{}, fmt.Errorf("reconciler: local: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read-only
	rep := LocalReport{LocalDrift: []Drift{}, BlindSpots: BlindSpots}
	for _, step := range []func(context.Context, pgx.Tx) ([]Drift, error){windowAcknowledged, windowStaged, eventItems, eventsTwice} {
		d, err := step(ctx, tx)
		if err != nil {
			return LocalReport{}, fmt.Errorf("reconciler: local: %w", err)
		}
		rep.LocalDrift = append(rep.LocalDrift, d...)
	}
	if rep.ItemsOpen, err = CountOpen(ctx, tx); err != nil {
		return LocalReport{}, err
	}
	return rep, nil
}

func windowAcknowledged(ctx context.Context, tx pgx.Tx) ([]Drift, error) {
	rows, err := tx.Query(ctx, `SELECT w.tenant, w.feature, w.period_start, w.acknowledged_to, coalesce(c.count, 0),
			coalesce(w.staged_item_id, 0)
		FROM usage_windows w
		LEFT JOIN usage_counters c USING (tenant, feature, period_start)
		WHERE w.acknowledged_to > coalesce(c.count, 0)
		ORDER BY w.tenant, w.feature, w.period_start`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Drift, error) {
		d := Drift{Rule: DriftWindowAcknowledged, ItemIDs: []int64{}}
		var staged int64
		err := r.Scan(&d.Tenant, &d.Feature, &d.PeriodStart, &d.Reported, &d.Counter, &staged)
		if staged != 0 {
			d.ItemIDs = append(d.ItemIDs, staged)
		}
		d.PeriodStart = d.PeriodStart.UTC()
		d.Subject = d.PeriodStart.Format(time.RFC3339)
		return d, err
	})
}

func windowStaged(ctx context.Context, tx pgx.Tx) ([]Drift, error) {
	rows, err := tx.Query(ctx, `SELECT o.id, o.tenant, o.feature, o.period_start, o.subject_ref, coalesce(c.count, 0)
		FROM outbox_items o
		LEFT JOIN usage_counters c ON c.tenant = o.tenant AND c.feature = o.feature AND c.period_start = o.period_start
		WHERE o.subject_kind = 'usage_window' AND o.state <> 'rejected'
		ORDER BY o.tenant, o.feature, o.period_start, o.id`)
	if err != nil {
		return nil, err
	}
	var out []Drift
	var (
		id        int64
		tenant    string
		feature   string
		period    time.Time
		ref       string
		count     int64
		malformed []int64
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &tenant, &feature, &period, &ref, &count}, func() error {
		_, to, _, ok := usage.WindowBounds(ref, feature, period.UTC())
		if !ok {
			malformed = append(malformed, id)
			return nil
		}
		if to > count {
			out = append(out, Drift{Rule: DriftWindowStaged, Tenant: tenant, Feature: feature, PeriodStart: period.UTC(),
				Subject: period.UTC().Format(time.RFC3339), Reported: to, Counter: count, ItemIDs: []int64{id}})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(malformed) > 0 {
		return nil, fmt.Errorf("usage window items with a subject_ref that is not a window reference: %v", malformed)
	}
	return out, nil
}

func eventItems(ctx context.Context, tx pgx.Tx) ([]Drift, error) {
	rows, err := tx.Query(ctx, `SELECT e.tenant, e.feature, o.period_start, e.event_id, o.quantity, e.quantity, o.id
		FROM usage_events e JOIN outbox_items o ON o.id = e.item_id
		WHERE e.kind = 'event' AND o.state <> 'rejected' AND o.quantity > e.quantity
		ORDER BY e.tenant, e.event_id`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Drift, error) {
		d := Drift{Rule: DriftEventItem}
		var id int64
		err := r.Scan(&d.Tenant, &d.Feature, &d.PeriodStart, &d.Subject, &d.Reported, &d.Counter, &id)
		d.PeriodStart = d.PeriodStart.UTC()
		d.ItemIDs = []int64{id}
		return d, err
	})
}

// eventsTwice groups event and correction items by their subject without
// the restage suffix (":r<g>").
func eventsTwice(ctx context.Context, tx pgx.Tx) ([]Drift, error) {
	rows, err := tx.Query(ctx, `SELECT id, tenant, feature, period_start, subject_kind, subject_ref
		FROM outbox_items WHERE subject_kind IN ('event', 'correction') AND state IN ('accepted', 'confirmed')
		ORDER BY tenant, subject_kind, id`)
	if err != nil {
		return nil, err
	}
	type key struct{ tenant, kind, base string }
	groups := map[key]*Drift{}
	var order []key
	var (
		id                   int64
		tenant, feature      string
		period               time.Time
		subjectKind, subject string
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &tenant, &feature, &period, &subjectKind, &subject}, func() error {
		k := key{tenant, subjectKind, baseSubject(subject)}
		d, ok := groups[k]
		if !ok {
			d = &Drift{Rule: DriftEventTwice, Tenant: tenant, Feature: feature, PeriodStart: period.UTC(), Subject: k.base, Counter: 1}
			groups[k] = d
			order = append(order, k)
		}
		d.Reported++
		d.ItemIDs = append(d.ItemIDs, id)
		return nil
	})
	if err != nil {
		return nil, err
	}
	var out []Drift
	for _, k := range order {
		if d := groups[k]; d.Reported > 1 {
			out = append(out, *d)
		}
	}
	return out, nil
}

// baseSubject strips a restage suffix ":r<g>" (usage.WithGeneration).
func baseSubject(ref string) string {
	i := strings.LastIndex(ref, ":r")
	if i < 0 {
		return ref
	}
	if _, err := strconv.Atoi(ref[i+2:]); err != nil {
		return ref
	}
	return ref[:i]
}

// driftFinding turns a Drift into a local_drift finding.
func driftFinding(d Drift) Finding {
	p := d.PeriodStart
	exp, obs := float64(d.Counter), float64(d.Reported)
	return Finding{
		Kind:        KindLocalDrift,
		Fingerprint: fmt.Sprintf("%s|%s|%s|%s|%s|%s", KindLocalDrift, d.Rule, d.Tenant, d.Feature, p.Format(time.RFC3339), d.Subject),
		Tenant:      d.Tenant, Feature: d.Feature, PeriodStart: &p,
		Expected: &exp, Observed: &obs,
		Detail:  fmt.Sprintf("%s: the ledger claims %d reported against a counter of %d (%s)", d.Rule, d.Reported, d.Counter, d.Subject),
		ItemIDs: d.ItemIDs,
	}
}
