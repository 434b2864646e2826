package reconcilertest

import (
	"errors"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/reconciler"
)

// The kinds found from the ledger during a provider run, table driven:
// each setup produces exactly the kinds listed.
func TestLedgerKinds(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		setup func(h *Harness)
		want  map[reconciler.Kind]int
	}{
		{"accepted but never at Stripe, past the confirm horizon", func(h *Harness) {
			id, _ := h.Item("t1", "api_calls", Ref(1), 2, t0.Add(5*time.Minute))
			h.Clock.Set(t0.Add(6 * time.Minute))
			h.Accept(id, "") // a 200 alone: Stripe never got it
			h.Clock.Set(t0.Add(50 * time.Hour))
		}, map[reconciler.Kind]int{reconciler.KindUnconfirmedAcceptance: 1, reconciler.KindSummaryShortfall: 1}},
		{"accepted, mapping gone, past the horizon", func(h *Harness) {
			h.Clock.Set(t0.Add(6 * time.Minute))
			h.Send("t1", "api_calls", Ref(1), 2, t0.Add(5*time.Minute))
			h.Exec(`DELETE FROM tenant_billing WHERE tenant = 't1'`)
			h.Clock.Set(t0.Add(50 * time.Hour))
		}, map[reconciler.Kind]int{reconciler.KindUnconfirmedAcceptance: 1}},
		{"reversal Stripe cannot carry", func(h *Harness) {
			h.Exec(`INSERT INTO outbox_items (tenant, subject_kind, subject_ref, exporter, destination_account, mode, mapping_version,
				feature, quantity, occurred_at, period_start, state, quarantine_reason)
				VALUES ('t1', 'correction', 'correction:c1', 'stripe_meter_events', $1, 'test', 1, 'api_calls', -3, $2, $3, 'quarantined', 'negative_quantity')`,
				Account, t0, t0.Truncate(24*time.Hour))
			h.Clock.Set(t0.Add(2 * time.Hour))
		}, map[reconciler.Kind]int{reconciler.KindReversalWithoutGrant: 1}},
		{"window acknowledged beyond its counter", func(h *Harness) {
			h.Exec(`INSERT INTO usage_counters (tenant, feature, period_start, count) VALUES ('t1', 'api_calls', $1, 3)`, t0.Truncate(24*time.Hour))
			h.Exec(`INSERT INTO usage_windows (tenant, feature, period_start, acknowledged_to) VALUES ('t1', 'api_calls', $1, 8)`, t0.Truncate(24*time.Hour))
			h.Clock.Set(t0.Add(2 * time.Hour))
		}, map[reconciler.Kind]int{reconciler.KindLocalDrift: 1}},
		{"nothing wrong", func(h *Harness) {
			h.Clock.Set(t0.Add(6 * time.Minute))
			h.Send("t1", "api_calls", Ref(1), 2, t0.Add(5*time.Minute))
			h.Clock.Set(t0.Add(50 * time.Hour))
		}, map[reconciler.Kind]int{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := New(t, Options{Start: t0, SettleLag: 10 * time.Minute})
			h.Customer("t1", "cus_1", true)
			tt.setup(h)
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

// Resolving records who looked and what they did: a blank resolution is
// refused invalid_resolution, and neither call moves an item or a counter.
func TestResolveChangesNoItemAndNoCounter(t *testing.T) {
	t.Parallel()
	h := New(t, Options{Start: t0, SettleLag: 10 * time.Minute})
	h.Customer("t1", "cus_1", true)
	h.Clock.Set(t0.Add(40 * time.Minute))
	h.Exec(`INSERT INTO usage_counters (tenant, feature, period_start, count) VALUES ('t1', 'api_calls', $1, 3)`, t0.Truncate(24*time.Hour))
	if err := h.Emu.AddMeteredPrice("price_api", h.Meters["api_calls"]); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Emu.SubscribeMetered("cus_1", "price_api", t0, time.Hour); err != nil {
		t.Fatal(err)
	}
	h.Send("t1", "api_calls", Ref(1), 3, t0.Add(30*time.Minute))
	h.Clock.Set(t0.Add(2*time.Hour + time.Minute)) // after the 10:00 finalization
	h.Send("t1", "api_calls", Ref(2), 2, t0.Add(50*time.Minute))
	h.Clock.Set(t0.Add(3 * time.Hour))
	h.Run()
	open := h.Open()
	if len(open) != 1 || open[0].Kind != reconciler.KindLateAfterFinalization {
		t.Fatalf("open %+v", open)
	}
	snapshot := func() string {
		var s string
		if err := h.Pool.QueryRow(h.Ctx, `SELECT (SELECT string_agg(id || state || lease_token, ',' ORDER BY id) FROM outbox_items) || '|' ||
			(SELECT string_agg(count::text, ',') FROM usage_counters)`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	before := snapshot()
	_, err := reconciler.Resolve(h.Ctx, h.Pool, open[0].ID, reconciler.ResolveInput{Resolution: "   ", Actor: "liam"}, nil)
	if !errors.Is(err, reconciler.ErrInvalidResolution) || reconciler.RefusalOf(err) != "invalid_resolution" {
		t.Fatalf("blank resolution: %v", err)
	}
	res, err := reconciler.Resolve(h.Ctx, h.Pool, open[0].ID, reconciler.ResolveInput{Resolution: "invoiced separately, see in_late_1", Actor: "liam"}, nil)
	if err != nil || res.Item.State != reconciler.StateResolved {
		t.Fatalf("resolve: %+v %v", res, err)
	}
	if after := snapshot(); after != before {
		t.Fatalf("resolve moved the ledger: %s → %s", before, after)
	}
	if n := h.Count(`SELECT count(*) FROM recovery_actions WHERE action = $1`, reconciler.ActionResolve); n != 2 {
		t.Fatalf("recorded %d actions, want the refusal and the resolve", n)
	}
	if rep := h.Run(); rep.FindingsNew != 0 || len(h.Open()) != 0 {
		t.Fatalf("a resolved difference found again adds nothing: %+v", rep)
	}
}
