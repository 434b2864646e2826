package reconciler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sync/errgroup"
)

// Options configure a Reconciler.
type Options struct {
	// Account: the destination account reconciled (the API key's account).
	Account string
	// SettleLag: windows are compared once their end is this far in the
	// past (SettleLagDefault).
	SettleLag time.Duration
	// Lookback: how far back windows are compared (LookbackDefault).
	Lookback time.Duration
	// ConfirmHorizon: accepted for longer than this and not confirmed is an
	// unconfirmed_acceptance (ConfirmHorizonDefault).
	ConfirmHorizon time.Duration
	// RequestsPerSecond: the provider's pace (RequestsPerSecondDefault).
	RequestsPerSecond int
	// Now, when set, is the run's "now" (tests, the demo); nil means the
	// database clock.
	Now func() time.Time
	// DryRun: compare and compute everything, write nothing (no run row,
	// no finding, no confirmation, no error report fetched): `auroractl
	// reconcile run` without --yes. RunReport says what a real run would
	// record.
	DryRun bool
	// Log: nil discards.
	Log *slog.Logger
}

// Reconciler compares the ledger with the provider and records the
// differences. Safe for one run at a time per database (a run takes a
// transaction-scoped advisory lock for its writes).
type Reconciler struct {
	db       DB
	provider Provider
	opts     Options
	log      *slog.Logger
}

// New returns a Reconciler. Zero durations take their defaults.
func New(db DB, provider Provider, opts Options) *Reconciler {
	if opts.SettleLag < 0 {
		opts.SettleLag = 0
	}
	if opts.Lookback <= 0 {
		opts.Lookback = LookbackDefault
	}
	if opts.ConfirmHorizon <= 0 {
		opts.ConfirmHorizon = ConfirmHorizonDefault
	}
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Reconciler{db: db, provider: provider, opts: opts, log: log}
}

// RunReport is what one provider run did.
type RunReport struct {
	RunID int64     `json:"run_id"`
	Now   time.Time `json:"now"`
	// SettledBefore: windows ending at or before it were compared.
	SettledBefore    time.Time `json:"settled_before"`
	WindowsCompared  int       `json:"windows_compared"`
	WindowsMatched   int       `json:"windows_matched"`
	WindowsUnsettled int       `json:"windows_unsettled"`
	ItemsConfirmed   int       `json:"items_confirmed"`
	FindingsNew      int       `json:"findings_new"`
	FindingsUpdated  int       `json:"findings_updated"`
	FindingsSame     int       `json:"findings_unchanged"`
	ReportsFetched   int       `json:"error_reports_fetched"`
	// ReportsPending: error reports the inbox stored that a dry run did
	// not fetch.
	ReportsPending int          `json:"error_reports_pending"`
	DryRun         bool         `json:"dry_run"`
	Findings       map[Kind]int `json:"findings_by_kind"`
	ItemsOpen      int          `json:"items_open"`
}

// ProviderConcurrency: provider calls of one run in flight at once. The
// pace is still the provider's (RequestsPerSecond, one limiter for all of
// them); this only stops one slow answer from idling the run, so a run over
// thousands of customers takes customers / RequestsPerSecond, not the sum
// of their latencies.
const ProviderConcurrency = 8

// runLockKey is the advisory lock that keeps runs from interleaving.
const runLockKey = 0x7265636f6e // "recon"

// run is one provider run's working state.
type run struct {
	r          *Reconciler
	now        time.Time
	cutoff     time.Time // settled before
	from       time.Time // first window start
	findings   []Finding
	confirm    []ledgerItem
	windows    []windowRow
	rejected   map[int64]bool // items an error report names
	report     RunReport
	customerOf map[string][]string // customer → tenants
	// unknownCustomers: customers Stripe does not know (ErrUnknownCustomer)
	unknownCustomers map[string]bool
}

// zeros is what Stripe holds for a customer it does not know: nothing, in
// every window of [start, end).
func zeros(start, end time.Time, hourly bool) []Summary {
	if !hourly {
		return []Summary{{Start: start, End: end}}
	}
	var out []Summary
	for t := start; t.Before(end); t = t.Add(time.Hour) {
		out = append(out, Summary{Start: t, End: t.Add(time.Hour)})
	}
	return out
}

// windowRow is a reconciliation_windows row to write.
type windowRow struct {
	Customer, MeterID string
	Start, End        time.Time
	Committed         int64
	Observed          *float64
	Settled, Matched  bool
}

// Run is one provider reconciliation (seed 000, "Provider findings"): the
// local check's drift, Stripe's meter error reports, the meter event
// summaries of every (customer, meter) with items in the lookback, and the
// customers' finalized invoices, each difference recorded as a
// reconciliation item and every accepted item a settled, matching window
// covers moved to confirmed. Errors: a provider failure (ErrProvider) or a
// database failure ends the run without recording its findings or
// confirmations; the run row records the failure.
func (r *Reconciler) Run(ctx context.Context) (RunReport, error) {
	now, err := r.clock(ctx)
	if err != nil {
		return RunReport{}, err
	}
	ru := &run{r: r, now: now, rejected: map[int64]bool{}, customerOf: map[string][]string{}, unknownCustomers: map[string]bool{}}
	ru.cutoff = now.Add(-r.opts.SettleLag).Truncate(time.Minute)
	ru.from = now.Add(-r.opts.Lookback).Truncate(time.Hour)
	ru.report = RunReport{Now: now, SettledBefore: ru.cutoff, Findings: map[Kind]int{}, DryRun: r.opts.DryRun}
	if r.opts.DryRun {
		err := ru.do(ctx)
		return ru.report, err
	}
	if err := r.db.QueryRow(ctx, `INSERT INTO reconciler_runs (kind, started_at, settled_before) VALUES ('provider', $1, $2) RETURNING id`,
		now, ru.cutoff).Scan(&ru.report.RunID); err != nil {
		return RunReport{}, fmt.Errorf("reconciler: start run: %w", err)
	}
	if err := ru.do(ctx); err != nil {
		class := "database"
		if errors.Is(err, ErrProvider) {
			class = "provider"
		} else if ctx.Err() != nil {
			class = "canceled"
		}
		_, _ = r.db.Exec(context.WithoutCancel(ctx), `UPDATE reconciler_runs SET finished_at = coalesce($2::timestamptz, now()), ok = false, error_class = $3 WHERE id = $1`,
			ru.report.RunID, r.wall(), class)
		return ru.report, err
	}
	return ru.report, nil
}

// clock returns the run's now: Options.Now, else the database's.
func (r *Reconciler) clock(ctx context.Context) (time.Time, error) {
	if r.opts.Now != nil {
		return r.opts.Now().UTC(), nil
	}
	var t time.Time
	if err := r.db.QueryRow(ctx, `SELECT now()`).Scan(&t); err != nil {
		return time.Time{}, fmt.Errorf("reconciler: clock: %w", err)
	}
	return t.UTC(), nil
}

// wall is the finish time: the injected clock's, or nil for the
// database's now().
func (r *Reconciler) wall() *time.Time {
	if r.opts.Now != nil {
		t := r.opts.Now().UTC()
		return &t
	}
	return nil
}

func (ru *run) do(ctx context.Context) error {
	local, err := Local(ctx, ru.r.db)
	if err != nil {
		return err
	}
	for _, d := range local.LocalDrift {
		ru.findings = append(ru.findings, driftFinding(d))
	}
	if err := ru.errorReports(ctx); err != nil {
		return err
	}
	l, err := loadLedger(ctx, ru.r.db, ru.r.opts.Account, ru.from, ru.now.Add(time.Hour))
	if err != nil {
		return err
	}
	if err := ru.summaries(ctx, l); err != nil {
		return err
	}
	if err := ru.invoices(ctx, l); err != nil {
		return err
	}
	if err := ru.unconfirmed(ctx); err != nil {
		return err
	}
	if err := ru.reversals(ctx); err != nil {
		return err
	}
	return ru.commit(ctx)
}

// pairKey is one (customer, meter) of the account.
type pairKey struct{ customer, meter string }

// hourOf is the hour window containing t.
func hourOf(t time.Time) time.Time { return t.UTC().Truncate(time.Hour) }

// summaries compares every (customer, meter) with items in the range.
func (ru *run) summaries(ctx context.Context, l *ledger) error {
	pairs := map[pairKey][]ledgerItem{}
	var order []pairKey
	features := map[string]string{} // meter → feature
	for _, it := range l.items {
		if it.Customer == "" || it.MeterID == "" {
			continue // never sendable as it stands; unconfirmed_acceptance names it if it was accepted
		}
		k := pairKey{it.Customer, it.MeterID}
		if _, ok := pairs[k]; !ok {
			order = append(order, k)
		}
		pairs[k] = append(pairs[k], it)
		features[it.MeterID] = it.Feature
		if !slices.Contains(ru.customerOf[it.Customer], it.Tenant) {
			ru.customerOf[it.Customer] = append(ru.customerOf[it.Customer], it.Tenant)
		}
	}
	hourEnd := hourOf(ru.cutoff)
	// Fetch every pair's summaries, ProviderConcurrency calls at a time
	// (all paced by the provider's one limiter), then compare in order:
	// compare writes the run's state and runs on this goroutine only.
	type fetched struct {
		got     []Summary
		unknown bool
	}
	results := make([]fetched, len(order))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(ProviderConcurrency)
	for i, k := range order {
		g.Go(func() error {
			f := &results[i]
			ask := func(start, end time.Time, hourly bool) error {
				s, err := ru.r.provider.EventSummaries(gctx, k.meter, k.customer, start, end, hourly)
				if errors.Is(err, ErrUnknownCustomer) {
					f.unknown, s, err = true, zeros(start, end, hourly), nil
				}
				f.got = append(f.got, s...)
				return err
			}
			if hourEnd.After(ru.from) {
				if err := ask(ru.from, hourEnd, true); err != nil {
					return err
				}
			}
			if ru.cutoff.After(hourEnd) && !hourEnd.Before(ru.from) {
				if err := ask(hourEnd, ru.cutoff, false); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	for i, k := range order {
		if results[i].unknown {
			ru.unknownCustomers[k.customer] = true
		}
		ru.compare(l, k, features[k.meter], pairs[k], results[i].got)
	}
	return nil
}

// window is one compared range with the items whose timestamp lies in it.
type window struct {
	start, end time.Time
	observed   float64
	items      []ledgerItem
}

// compare decides every window of one pair: summaries got (settled) and
// the hours after the cutoff (unsettled).
func (ru *run) compare(l *ledger, k pairKey, feature string, items []ledgerItem, got []Summary) {
	ws := make([]*window, 0, len(got))
	for _, s := range got {
		ws = append(ws, &window{start: s.Start, end: s.End, observed: s.Value})
	}
	unsettled := map[time.Time][]ledgerItem{}
	for _, it := range items {
		placed := false
		for _, w := range ws {
			if !it.OccurredAt.Before(w.start) && it.OccurredAt.Before(w.end) {
				w.items = append(w.items, it)
				placed = true
				break
			}
		}
		if !placed && !it.OccurredAt.Before(ru.cutoff) {
			h := hourOf(it.OccurredAt)
			unsettled[h] = append(unsettled[h], it)
		}
	}
	for h, its := range unsettled {
		var c int64
		for _, it := range its {
			if committedState(it.State) {
				v, _ := l.value(it.ID)
				c += v
			}
		}
		start := h
		if h.Before(ru.cutoff) {
			start = ru.cutoff // the part of the cutoff's hour after it
		}
		ru.windows = append(ru.windows, windowRow{Customer: k.customer, MeterID: k.meter, Start: start, End: h.Add(time.Hour), Committed: c})
		ru.report.WindowsUnsettled++
	}
	for _, w := range ws {
		ru.decide(l, k, feature, w)
	}
}

// decide compares one settled window.
func (ru *run) decide(l *ledger, k pairKey, feature string, w *window) {
	var committed, uncertainQty int64
	var committedIDs, uncertainIDs, acceptedIDs []int64
	decided := true
	for _, it := range w.items {
		v, ok := l.value(it.ID)
		switch {
		case inFlight(it.State):
			decided = false
		case it.State == "uncertain":
			uncertainIDs = append(uncertainIDs, it.ID)
			uncertainQty += it.Quantity
		case committedState(it.State):
			if !ok {
				decided = false
			}
			committed += v
			committedIDs = append(committedIDs, it.ID)
			if it.State == "accepted" {
				acceptedIDs = append(acceptedIDs, it.ID)
			}
		}
	}
	if len(w.items) == 0 && w.observed == 0 {
		return // nothing on either side
	}
	obs := w.observed
	row := windowRow{Customer: k.customer, MeterID: k.meter, Start: w.start, End: w.end, Committed: committed, Observed: &obs, Settled: decided}
	if !decided {
		// an item of the window is still being sent: not final yet
		row.Observed = nil
		ru.windows = append(ru.windows, row)
		ru.report.WindowsUnsettled++
		return
	}
	ru.report.WindowsCompared++
	exp := float64(committed)
	start, end := w.start, w.end
	base := Finding{Tenant: strings.Join(ru.customerOf[k.customer], ","), Feature: feature, Account: ru.r.opts.Account, MeterID: k.meter,
		PeriodStart: &start, PeriodEnd: &end, Expected: &exp, Observed: &obs}
	fp := func(kind Kind) string {
		return fmt.Sprintf("%s|%s|%s|%s|%s", kind, ru.r.opts.Account, k.customer, k.meter, hourOf(w.start).Format(time.RFC3339))
	}
	span := fmt.Sprintf("[%s, %s)", w.start.Format(time.RFC3339), w.end.Format(time.RFC3339))
	switch {
	case obs == exp:
		row.Matched = true
		ru.report.WindowsMatched++
		if len(uncertainIDs) > 0 {
			break // equal sums with an uncertain item in the window prove nothing about each item
		}
		for _, it := range w.items {
			if it.State == "accepted" && !ru.rejected[it.ID] {
				ru.confirm = append(ru.confirm, it)
			}
		}
	case obs < exp:
		f := base
		f.Kind, f.Fingerprint = KindSummaryShortfall, fp(KindSummaryShortfall)
		f.ItemIDs = committedIDs
		f.Detail = fmt.Sprintf("settled summary window %s holds %s; aurora committed %d in %d accepted or confirmed items: Stripe will bill %s less",
			span, fmtQty(obs), committed, len(committedIDs), fmtQty(exp-obs))
		if n := ru.countRejected(committedIDs); n > 0 {
			f.Detail += fmt.Sprintf("; %d of them named by a meter error report", n)
		}
		if ru.unknownCustomers[k.customer] {
			f.Detail += "; Stripe does not know the customer (resource_missing): check the tenant's customer mapping"
		}
		ru.findings = append(ru.findings, f)
	default:
		f := base
		f.Kind, f.Fingerprint = KindSummaryExcess, fp(KindSummaryExcess)
		f.ItemIDs = append(slices.Clone(committedIDs), uncertainIDs...)
		f.Detail = fmt.Sprintf("settled summary window %s holds %s; aurora committed %d: Stripe counts %s more than was committed (a double bill)",
			span, fmtQty(obs), committed, fmtQty(obs-exp))
		if len(uncertainIDs) > 0 {
			f.Detail += fmt.Sprintf("; %d uncertain items (quantity %d) in the window may have landed: check them with auroractl recovery inspect",
				len(uncertainIDs), uncertainQty)
		}
		ru.findings = append(ru.findings, f)
	}
	_ = acceptedIDs
	ru.windows = append(ru.windows, row)
}

func (ru *run) countRejected(ids []int64) int {
	n := 0
	for _, id := range ids {
		if ru.rejected[id] {
			n++
		}
	}
	return n
}

// fmtQty prints a quantity without a spurious fraction.
func fmtQty(v float64) string {
	if v == float64(int64(v)) {
		return fmt.Sprintf("%d", int64(v))
	}
	return fmt.Sprintf("%g", v)
}

// unconfirmed finds accepted items older than the confirm horizon. It reads
// the unfinished items (outbox_items_unfinished_created_idx, migration
// 00311: outbox_items has no index on state).
func (ru *run) unconfirmed(ctx context.Context) error {
	before := ru.now.Add(-ru.r.opts.ConfirmHorizon)
	rows, err := ru.r.db.Query(ctx, `SELECT `+ledgerColumns+`
		WHERE NOT o.finished AND o.destination_account = $1 AND o.state = 'accepted'`, ru.r.opts.Account)
	if err != nil {
		return fmt.Errorf("reconciler: unconfirmed: %w", err)
	}
	items, err := scanLedger(rows)
	if err != nil {
		return fmt.Errorf("reconciler: unconfirmed: %w", err)
	}
	confirming := map[int64]bool{}
	for _, it := range ru.confirm {
		confirming[it.ID] = true
	}
	for _, it := range items {
		if !it.AcceptedAt.Before(before) || confirming[it.ID] {
			continue // this run confirms it
		}
		at := it.OccurredAt
		q := float64(it.Quantity)
		why := "no settled summary window has matched it"
		switch {
		case it.Customer == "":
			why = "its tenant has no Stripe customer on the account any more"
		case it.MeterID == "":
			why = "its feature has no meter mapping on the account any more"
		case it.OccurredAt.Before(ru.from):
			why = "its window is older than the lookback and was never matched"
		}
		ru.findings = append(ru.findings, Finding{
			Kind: KindUnconfirmedAcceptance, Fingerprint: fmt.Sprintf("%s|%d", KindUnconfirmedAcceptance, it.ID),
			Tenant: it.Tenant, Feature: it.Feature, Account: ru.r.opts.Account, MeterID: it.MeterID, PeriodStart: &at,
			Expected: &q, Detail: fmt.Sprintf("accepted at %s, over %s ago, and still not confirmed: %s",
				it.AcceptedAt.Format(time.RFC3339), ru.r.opts.ConfirmHorizon, why),
			ItemIDs: []int64{it.ID},
		})
	}
	return nil
}

// reversals finds negative corrections Stripe cannot carry.
func (ru *run) reversals(ctx context.Context) error {
	rows, err := ru.r.db.Query(ctx, `SELECT o.id, o.tenant, o.feature, o.quantity, o.period_start
		FROM outbox_items o
		WHERE o.destination_account = $1 AND o.subject_kind = 'correction' AND o.state = 'quarantined'
		  AND o.quarantine_reason = 'negative_quantity' ORDER BY o.id`, ru.r.opts.Account)
	if err != nil {
		return fmt.Errorf("reconciler: reversals: %w", err)
	}
	var (
		id              int64
		tenant, feature string
		qty             int64
		period          time.Time
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &tenant, &feature, &qty, &period}, func() error {
		p := period.UTC()
		exp := float64(-qty)
		zero := 0.0
		ru.findings = append(ru.findings, Finding{
			Kind: KindReversalWithoutGrant, Fingerprint: fmt.Sprintf("%s|%d", KindReversalWithoutGrant, id),
			Tenant: tenant, Feature: feature, Account: ru.r.opts.Account, PeriodStart: &p, Expected: &exp, Observed: &zero,
			Detail:  fmt.Sprintf("a reversal of %d that Stripe cannot carry (quarantined negative_quantity): the customer is owed a credit; grant it (e.g. a credit note) and resolve with its reference", -qty),
			ItemIDs: []int64{id},
		})
		return nil
	})
	if err != nil {
		return fmt.Errorf("reconciler: reversals: %w", err)
	}
	return nil
}

// commit records the run's findings, windows and confirmations in one
// transaction under the run lock. Confirmation is fenced: only an item
// still accepted with the lease token it was compared at moves.
func (ru *run) commit(ctx context.Context) error {
	tx, err := ru.r.db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("reconciler: commit: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit it is a no-op
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(runLockKey)); err != nil {
		return fmt.Errorf("reconciler: commit: lock: %w", err)
	}
	now := ru.now
	sort.SliceStable(ru.findings, func(i, j int) bool { return ru.findings[i].Fingerprint < ru.findings[j].Fingerprint })
	for _, f := range ru.findings {
		res, err := record(ctx, tx, f, &now)
		if err != nil {
			return err
		}
		switch res {
		case upsertInserted:
			ru.report.FindingsNew++
		case upsertUpdated:
			ru.report.FindingsUpdated++
		default:
			ru.report.FindingsSame++
		}
		ru.report.Findings[f.Kind]++
	}
	for _, w := range ru.windows {
		if _, err := tx.Exec(ctx, `INSERT INTO reconciliation_windows (destination_account, stripe_customer, meter_id, window_start, window_end,
				committed, observed, settled, matched, compared_at, run_id)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
			ON CONFLICT (destination_account, stripe_customer, meter_id, window_start) DO UPDATE SET
				window_end = EXCLUDED.window_end, committed = EXCLUDED.committed, observed = EXCLUDED.observed,
				settled = EXCLUDED.settled, matched = EXCLUDED.matched, compared_at = EXCLUDED.compared_at, run_id = EXCLUDED.run_id`,
			ru.r.opts.Account, w.Customer, w.MeterID, w.Start, w.End, w.Committed, w.Observed, w.Settled, w.Matched, now, ru.report.RunID); err != nil {
			return fmt.Errorf("reconciler: commit: window: %w", err)
		}
	}
	if len(ru.confirm) > 0 {
		ids := make([]int64, len(ru.confirm))
		tokens := make([]int64, len(ru.confirm))
		for i, it := range ru.confirm {
			ids[i], tokens[i] = it.ID, it.LeaseToken
		}
		tag, err := tx.Exec(ctx, `UPDATE outbox_items o SET state = 'confirmed'
			FROM unnest($1::bigint[], $2::bigint[]) AS c(id, lease_token)
			WHERE o.id = c.id AND o.state = 'accepted' AND o.lease_token = c.lease_token`, ids, tokens)
		if err != nil {
			return fmt.Errorf("reconciler: commit: confirm: %w", err)
		}
		ru.report.ItemsConfirmed = int(tag.RowsAffected())
	}
	if ru.report.ItemsOpen, err = CountOpen(ctx, tx); err != nil {
		return err
	}
	if ru.r.opts.DryRun {
		return nil // the deferred rollback undoes every write above
	}
	if _, err := tx.Exec(ctx, `UPDATE reconciler_runs SET finished_at = coalesce($2::timestamptz, now()), ok = true, windows_compared = $3, windows_unsettled = $4,
			windows_matched = $5, items_confirmed = $6, findings_new = $7, findings_updated = $8 WHERE id = $1`,
		ru.report.RunID, ru.r.wall(), ru.report.WindowsCompared, ru.report.WindowsUnsettled, ru.report.WindowsMatched,
		ru.report.ItemsConfirmed, ru.report.FindingsNew, ru.report.FindingsUpdated); err != nil {
		return fmt.Errorf("reconciler: commit: run: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("reconciler: commit: %w", err)
	}
	ru.r.log.Info("reconciler run", "run_id", ru.report.RunID, "windows_compared", ru.report.WindowsCompared,
		"windows_matched", ru.report.WindowsMatched, "windows_unsettled", ru.report.WindowsUnsettled,
		"items_confirmed", ru.report.ItemsConfirmed, "findings_new", ru.report.FindingsNew, "items_open", ru.report.ItemsOpen)
	return nil
}
