package reconciler

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sync/errgroup"
)

// invoices compares the metered lines of every finalized invoice of the
// run's customers with what was committed for the line's customer, meter
// and period: accepted by the finalization (the line must bill exactly
// that), and accepted after it (known to Stripe, never billed).
func (ru *run) invoices(ctx context.Context, l *ledger) error {
	mapped, err := ru.meterFeatures(ctx)
	if err != nil {
		return err
	}
	customers := make([]string, 0, len(ru.customerOf))
	for c := range ru.customerOf {
		customers = append(customers, c)
	}
	slices.Sort(customers)
	// Fetched ProviderConcurrency at a time, compared in order on this
	// goroutine (invoiceLine writes the run's state).
	fetched := make([][]Invoice, len(customers))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(ProviderConcurrency)
	for i, cust := range customers {
		g.Go(func() error {
			invs, err := ru.r.provider.FinalizedInvoices(gctx, cust, ru.from)
			fetched[i] = invs
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	for _, invs := range fetched {
		for _, inv := range invs {
			for _, line := range inv.Lines {
				if err := ru.invoiceLine(ctx, l, mapped, inv, line); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// meterFeatures maps the account's meters to their features.
func (ru *run) meterFeatures(ctx context.Context) (map[string]string, error) {
	rows, err := ru.r.db.Query(ctx, `SELECT meter_id, feature FROM meter_mappings WHERE destination_account = $1`, ru.r.opts.Account)
	if err != nil {
		return nil, fmt.Errorf("reconciler: meter mappings: %w", err)
	}
	out := map[string]string{}
	var meter, feature string
	if _, err := pgx.ForEachRow(rows, []any{&meter, &feature}, func() error { out[meter] = feature; return nil }); err != nil {
		return nil, fmt.Errorf("reconciler: meter mappings: %w", err)
	}
	return out, nil
}

func (ru *run) invoiceLine(ctx context.Context, l *ledger, mapped map[string]string, inv Invoice, line InvoiceLine) error {
	ps, pe := line.PeriodStart, line.PeriodEnd
	obs := float64(line.Quantity)
	tenants := strings.Join(ru.customerOf[inv.Customer], ",")
	feature, ok := mapped[line.MeterID]
	if !ok {
		ru.findings = append(ru.findings, Finding{
			Kind: KindUnmappedPrice, Fingerprint: fmt.Sprintf("%s|%s|%s", KindUnmappedPrice, ru.r.opts.Account, line.PriceID),
			Tenant: tenants, Account: ru.r.opts.Account, MeterID: line.MeterID, PeriodStart: &ps, PeriodEnd: &pe, Observed: &obs,
			Detail: fmt.Sprintf("invoice %s bills metered price %s on meter %s, which no aurora feature maps to on this account: map the feature or confirm the usage is not aurora's",
				inv.ID, line.PriceID, line.MeterID),
		})
		return nil
	}
	// The line's period may begin before the run's range: load it whole.
	pl := l
	if ps.Before(ru.from) {
		var err error
		if pl, err = loadLedger(ctx, ru.r.db, ru.r.opts.Account, ps, pe); err != nil {
			return err
		}
	}
	var billed, late int64
	var billedIDs, lateIDs []int64
	for _, it := range pl.items {
		if it.Customer != inv.Customer || it.MeterID != line.MeterID || it.OccurredAt.Before(ps) || !it.OccurredAt.Before(pe) || !committedState(it.State) {
			continue
		}
		v, _ := pl.value(it.ID)
		if it.AcceptedAt.After(inv.FinalizedAt) {
			late += v
			lateIDs = append(lateIDs, it.ID)
			continue
		}
		billed += v
		billedIDs = append(billedIDs, it.ID)
	}
	span := fmt.Sprintf("[%s, %s)", ps.Format(time.RFC3339), pe.Format(time.RFC3339))
	if len(lateIDs) > 0 {
		exp, zero := float64(late), 0.0
		ru.findings = append(ru.findings, Finding{
			Kind: KindLateAfterFinalization, Fingerprint: fmt.Sprintf("%s|%s|%s", KindLateAfterFinalization, inv.ID, line.ID),
			Tenant: tenants, Feature: feature, Account: ru.r.opts.Account, MeterID: line.MeterID, PeriodStart: &ps, PeriodEnd: &pe,
			Expected: &exp, Observed: &zero,
			Detail: fmt.Sprintf("%d items (quantity %d) of period %s were accepted after invoice %s finalized at %s: Stripe knows the usage and never bills it; invoice it separately or credit it",
				len(lateIDs), late, span, inv.ID, inv.FinalizedAt.Format(time.RFC3339)),
			ItemIDs: lateIDs,
		})
	}
	if line.Quantity != billed {
		exp := float64(billed)
		ru.findings = append(ru.findings, Finding{
			Kind: KindInvoiceQuantityMismatch, Fingerprint: fmt.Sprintf("%s|%s|%s", KindInvoiceQuantityMismatch, inv.ID, line.ID),
			Tenant: tenants, Feature: feature, Account: ru.r.opts.Account, MeterID: line.MeterID, PeriodStart: &ps, PeriodEnd: &pe,
			Expected: &exp, Observed: &obs,
			Detail: fmt.Sprintf("invoice %s line %s bills %d for period %s; aurora committed %d accepted by its finalization at %s",
				inv.ID, line.ID, line.Quantity, span, billed, inv.FinalizedAt.Format(time.RFC3339)),
			ItemIDs: billedIDs,
		})
	}
	return nil
}
