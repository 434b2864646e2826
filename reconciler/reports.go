package reconciler

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// maxReportsPerRun bounds the thin events fetched per run; the rest wait
// for the next run.
const maxReportsPerRun = 500

// errorReports fetches the full body of every meter error report the inbox
// stored and the reconciler has not fetched yet, stores it, and matches the
// samples of every stored report to items by identifier (the meter event
// identifier aurora sends is the item's idempotency key, which is also the
// request's Idempotency-Key).
func (ru *run) errorReports(ctx context.Context) error {
	rows, err := ru.r.db.Query(ctx, `SELECT b.event_id FROM billing_events b
		WHERE b.event_type = ANY($1) AND NOT EXISTS (SELECT 1 FROM meter_error_reports r WHERE r.event_id = b.event_id)
		ORDER BY b.received_at, b.event_id LIMIT $2`, MeterErrorEventTypes, maxReportsPerRun)
	if err != nil {
		return fmt.Errorf("reconciler: error reports: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("reconciler: error reports: %w", err)
	}
	if ru.r.opts.DryRun {
		ru.report.ReportsPending = len(ids)
		return ru.matchReports(ctx)
	}
	for _, id := range ids {
		ev, err := ru.r.provider.CoreEvent(ctx, id)
		if err != nil {
			return err
		}
		raw := ev.Raw
		if len(raw) == 0 {
			raw = json.RawMessage(`{}`)
		}
		var vs, ve *time.Time
		if !ev.Data.ValidationStart.IsZero() {
			vs = &ev.Data.ValidationStart
		}
		if !ev.Data.ValidationEnd.IsZero() {
			ve = &ev.Data.ValidationEnd
		}
		if _, err := ru.r.db.Exec(ctx, `INSERT INTO meter_error_reports (event_id, event_type, meter_id, event_created, validation_start,
				validation_end, error_count, data, fetched_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8::jsonb, $9)
			ON CONFLICT (event_id) DO NOTHING`,
			id, ev.Type, ev.MeterID, ev.Created, vs, ve, ev.Data.Reason.ErrorCount, string(raw), ru.now); err != nil {
			return fmt.Errorf("reconciler: store error report: %w", err)
		}
		ru.report.ReportsFetched++
	}
	return ru.matchReports(ctx)
}

type storedReport struct {
	EventID, Type, MeterID string
	Created                *time.Time
	ErrorCount             int64
	Data                   ErrorReportData
}

// matchReports turns every stored report's samples into async_rejection
// findings and each report whose count exceeds what its samples attribute
// into an error_report_unattributed finding.
func (ru *run) matchReports(ctx context.Context) error {
	rows, err := ru.r.db.Query(ctx, `SELECT event_id, event_type, meter_id, event_created, error_count, data FROM meter_error_reports ORDER BY event_id`)
	if err != nil {
		return fmt.Errorf("reconciler: match reports: %w", err)
	}
	reports, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (storedReport, error) {
		var s storedReport
		var data []byte
		if err := r.Scan(&s.EventID, &s.Type, &s.MeterID, &s.Created, &s.ErrorCount, &data); err != nil {
			return s, err
		}
		_ = json.Unmarshal(data, &s.Data) // stored by us from a parsed body
		return s, nil
	})
	if err != nil {
		return fmt.Errorf("reconciler: match reports: %w", err)
	}
	for _, rep := range reports {
		type sample struct{ code, identifier string }
		var samples []sample
		for _, et := range rep.Data.Reason.ErrorTypes {
			for _, se := range et.SampleErrors {
				if id := strings.TrimSpace(se.Request.Identifier); id != "" {
					samples = append(samples, sample{et.Code, id})
				}
			}
		}
		keys := make([]string, len(samples))
		for i, s := range samples {
			keys[i] = s.identifier
		}
		items, err := ru.itemsByKey(ctx, keys)
		if err != nil {
			return err
		}
		var matched int64
		for _, s := range samples {
			it, ok := items[s.identifier]
			if !ok {
				continue
			}
			matched++
			ru.rejected[it.ID] = true
			at := it.OccurredAt
			q := float64(it.Quantity)
			zero := 0.0
			ru.findings = append(ru.findings, Finding{
				Kind: KindAsyncRejection, Fingerprint: fmt.Sprintf("%s|%d", KindAsyncRejection, it.ID),
				Tenant: it.Tenant, Feature: it.Feature, Account: ru.r.opts.Account, MeterID: it.MeterID, PeriodStart: &at,
				Expected: &q, Observed: &zero,
				Detail: fmt.Sprintf("Stripe answered 200 and rejected the meter event later: %s (meter error report %s); the item stays %s, is not confirmed and is not resent: fix the cause, then decide with the customer how to bill it",
					s.code, rep.EventID, it.State),
				ItemIDs: []int64{it.ID},
			})
		}
		total := rep.ErrorCount
		if total == 0 {
			for _, et := range rep.Data.Reason.ErrorTypes {
				total += et.ErrorCount
			}
		}
		if total > matched {
			exp, obs := float64(total), float64(matched)
			f := Finding{
				Kind: KindErrorReportUnattributed, Fingerprint: fmt.Sprintf("%s|%s", KindErrorReportUnattributed, rep.EventID),
				Account: ru.r.opts.Account, MeterID: rep.MeterID, Expected: &exp, Observed: &obs,
				Detail: fmt.Sprintf("meter error report %s (%s) counts %d failed meter events and its samples name %d of aurora's items; the summaries comparison finds the rest as summary_shortfall (%s)",
					rep.EventID, rep.Type, total, matched, codes(rep.Data)),
			}
			if !rep.Data.ValidationStart.IsZero() {
				vs, ve := rep.Data.ValidationStart, rep.Data.ValidationEnd
				f.PeriodStart, f.PeriodEnd = &vs, &ve
			}
			ru.findings = append(ru.findings, f)
		}
	}
	return nil
}

func codes(d ErrorReportData) string {
	var parts []string
	for _, et := range d.Reason.ErrorTypes {
		parts = append(parts, fmt.Sprintf("%s: %d", et.Code, et.ErrorCount))
	}
	if len(parts) == 0 {
		return "no error types"
	}
	return strings.Join(parts, ", ")
}

// itemsByKey returns the account's items whose idempotency key is one of
// keys.
func (ru *run) itemsByKey(ctx context.Context, keys []string) (map[string]ledgerItem, error) {
	out := map[string]ledgerItem{}
	if len(keys) == 0 {
		return out, nil
	}
	rows, err := ru.r.db.Query(ctx, `SELECT `+ledgerColumns+` WHERE o.destination_account = $1 AND o.idempotency_key = ANY($2)`,
		ru.r.opts.Account, keys)
	if err != nil {
		return nil, fmt.Errorf("reconciler: items by key: %w", err)
	}
	items, err := scanLedger(rows)
	if err != nil {
		return nil, fmt.Errorf("reconciler: items by key: %w", err)
	}
	for _, it := range items {
		out[it.Key] = it
	}
	return out, nil
}
