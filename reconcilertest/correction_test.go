package reconcilertest

import (
	"testing"
	"time"

	"github.com/aurora-billing/aurora/deliverer"
	"github.com/aurora-billing/aurora/reconciler"
	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/aurora-billing/aurora/shared/usage"
	"github.com/jackc/pgx/v5"
)

// record records ev through the usage gate (events source) and returns its
// export item.
func (h *Harness) record(ev usage.Event) outbox.Row {
	h.T.Helper()
	g := usage.Gate{Recorder: usage.Recorder{DestinationAccount: Account, Mode: identity.ModeTest, Period: usage.PeriodDay},
		Sources: usage.Sources{ev.Feature: usage.SourceEvents}}
	var row outbox.Row
	if err := pgx.BeginFunc(h.Ctx, h.Pool, func(tx pgx.Tx) error {
		var err error
		row, _, err = g.Record(h.Ctx, tx, ev)
		return err
	}); err != nil {
		h.T.Fatal(err)
	}
	return row
}

// request is the meter event of row with value, as the deliverer builds it.
func (h *Harness) request(row outbox.Row, value int64) deliverer.Request {
	h.T.Helper()
	var customer, event string
	if err := h.Pool.QueryRow(h.Ctx, `SELECT tb.stripe_customer, m.event_name FROM tenant_billing tb, meter_mappings m
		WHERE tb.tenant = $1 AND tb.destination_account = $2 AND m.destination_account = $2 AND m.feature = $3`, row.Tenant, Account, row.Feature).
		Scan(&customer, &event); err != nil {
		h.T.Fatal(err)
	}
	return deliverer.Request{ItemID: row.ID, Key: row.IdempotencyKey, EventName: event, CustomerKey: "stripe_customer_id",
		ValueKey: "value", Customer: customer, Value: value, Timestamp: row.OccurredAt}
}

// A negative correction delivered as the deliverer does it (the plan,
// the cancel of the corrected event, the restated value under the
// correction's identifier) reconciles clean: Stripe's sum equals the
// committed sum (10 − 4). When the cancel landed but the restate did not
// (the correction ended rejected or quarantined, so it is not committed),
// the ledger still counts the corrected record's 10 while Stripe carries 0
// for it: the period is reported summary_shortfall (10 less), the
// corrected record unconfirmed_acceptance (no settled window holds it),
// and a quarantined correction also reversal_without_grant.
func TestCancelRestateReconciles(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		restate bool         // the restate lands and the correction is accepted
		end     outbox.State // else: the correction's end state
		want    map[reconciler.Kind]int
	}{
		{"cancel and restate", true, "", map[reconciler.Kind]int{}},
		{"cancel landed, restate rejected", false, outbox.StateRejected, map[reconciler.Kind]int{reconciler.KindSummaryShortfall: 1, reconciler.KindUnconfirmedAcceptance: 1}},
		{"cancel landed, restate quarantined", false, outbox.StateQuarantined,
			map[reconciler.Kind]int{reconciler.KindSummaryShortfall: 1, reconciler.KindUnconfirmedAcceptance: 1, reconciler.KindReversalWithoutGrant: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := New(t, Options{Start: t0, SettleLag: 10 * time.Minute})
			h.Customer("t1", "cus_1", true)
			at := t0.Add(5 * time.Minute)
			h.Clock.Set(t0.Add(6 * time.Minute))
			orig := h.record(usage.Event{Tenant: "t1", EventID: "e1", Feature: "api_calls", Quantity: 10, OccurredAt: at})
			if res := h.exporter.Export(h.Ctx, h.request(orig, 10)); res.Outcome != deliverer.OutcomeAccepted {
				t.Fatalf("original: %+v", res)
			}
			h.Accept(orig.ID, "")
			h.Clock.Set(t0.Add(time.Hour))
			corr := h.record(usage.Event{Tenant: "t1", EventID: "e1-fix", Feature: "api_calls", Quantity: -4, OccurredAt: at, CorrectsEventID: "e1"})
			now := h.Clock.Now()
			plan, err := usage.PlanCorrection(h.Ctx, h.Pool, corr, &now)
			if err != nil || plan.Action != usage.CorrectionCancelRestate || plan.Value != 6 {
				t.Fatalf("plan %+v, %v", plan, err)
			}
			req := h.request(corr, plan.Value)
			if res := h.exporter.Cancel(h.Ctx, deliverer.CancelRequest{ItemID: corr.ID, Key: plan.CancelIdempotencyKey,
				EventName: req.EventName, Identifier: plan.CancelIdentifier}); res.Outcome != deliverer.OutcomeAccepted {
				t.Fatalf("cancel: %+v", res)
			}
			if tt.restate {
				if res := h.exporter.Export(h.Ctx, req); res.Outcome != deliverer.OutcomeAccepted {
					t.Fatalf("restate: %+v", res)
				}
				h.Accept(corr.ID, "")
			} else {
				h.Exec(`UPDATE outbox_items SET state = $2, quarantine_reason = CASE WHEN $2 = 'quarantined' THEN 'negative_quantity' END WHERE id = $1`,
					corr.ID, string(tt.end))
			}
			h.Clock.Set(t0.Add(50 * time.Hour))
			h.Run()
			got := kindsOf(h.Open())
			if len(got) != len(tt.want) {
				t.Fatalf("kinds %v, want %v (%+v)", got, tt.want, h.Open())
			}
			for k, n := range tt.want {
				if got[k] != n {
					t.Fatalf("kinds %v, want %v", got, tt.want)
				}
			}
		})
	}
}
