package reconcilertest

import (
	"testing"
	"time"

	"github.com/aurora-billing/aurora/reconciler"
)

var t0 = time.Date(2026, 9, 15, 8, 0, 0, 0, time.UTC)

func kindsOf(items []reconciler.Item) map[reconciler.Kind]int {
	out := map[reconciler.Kind]int{}
	for _, it := range items {
		out[it.Kind]++
	}
	return out
}

// Every accepted item in settled windows that match ends confirmed, and a
// second run adds nothing. Items at the window's first second and last
// second belong to it (start inclusive, end exclusive); the settle cutoff
// falls inside an hour, whose settled part is compared as one
// minute-aligned summary and the rest stays unsettled.
func TestCleanRunConfirmsAndAddsNothingTwice(t *testing.T) {
	t.Parallel()
	h := New(t, Options{Start: t0, SettleLag: 10 * time.Minute})
	h.Customer("t1", "cus_1", true)
	h.Customer("t2", "cus_2", true)
	var ids []int64
	for i, at := range []time.Time{t0, t0.Add(59*time.Minute + 59*time.Second), t0.Add(time.Hour), t0.Add(90 * time.Minute)} {
		h.Clock.Set(at)
		ids = append(ids, h.Send("t1", "api_calls", Ref(i), int64(i+1), at))
		ids = append(ids, h.Send("t2", "api_calls", Ref(100+i), 7, at))
	}
	late := t0.Add(100 * time.Minute)
	h.Clock.Set(late)
	lateID := h.Send("t1", "api_calls", Ref(9), 5, late)
	// cutoff = 08:00 + 1h45m − 10m = 09:35: [08:00, 09:00) hourly, [09:00, 09:35) as the tail
	h.Clock.Set(t0.Add(105 * time.Minute))
	rep := h.Run()
	if len(h.Open()) != 0 {
		t.Fatalf("open items: %+v", h.Open())
	}
	if rep.ItemsConfirmed != len(ids) {
		t.Fatalf("confirmed %d, want %d (%+v)", rep.ItemsConfirmed, len(ids), rep)
	}
	if rep.WindowsUnsettled == 0 {
		t.Fatalf("the 09:40 item's window must be unsettled: %+v", rep)
	}
	var state string
	if err := h.Pool.QueryRow(h.Ctx, `SELECT state FROM outbox_items WHERE id = $1`, lateID).Scan(&state); err != nil || state != "accepted" {
		t.Fatalf("late item %s (%v), want accepted", state, err)
	}
	ev, err := reconciler.Evidence(h.Ctx, h.Pool, lateID)
	if err != nil || ev.Window == nil || ev.Window.Settled {
		t.Fatalf("evidence of the unsettled item: %+v %v", ev, err)
	}
	rep2 := h.Run()
	if rep2.FindingsNew != 0 || rep2.ItemsConfirmed != 0 || len(h.Open()) != 0 {
		t.Fatalf("second run: %+v", rep2)
	}
	h.Clock.Set(t0.Add(3 * time.Hour))
	if rep3 := h.Run(); rep3.ItemsConfirmed != 1 || len(h.Open()) != 0 {
		t.Fatalf("after the lag: %+v, open %+v", rep3, h.Open())
	}
	if got := h.States(); got["confirmed"] != len(ids)+1 || got["accepted"] != 0 {
		t.Fatalf("states %v", got)
	}
}

// With a summary lag longer than the run nothing is reported missing; once
// the lag has passed the same data reconciles clean.
func TestSummaryLagIsUnsettledNeverMissing(t *testing.T) {
	t.Parallel()
	h := New(t, Options{Start: t0, SettleLag: 2 * time.Hour, SummaryLag: 90 * time.Minute})
	h.Customer("t1", "cus_1", true)
	for i := 0; i < 5; i++ {
		at := t0.Add(time.Duration(i) * 10 * time.Minute)
		h.Clock.Set(at)
		h.Send("t1", "api_calls", Ref(i), 2, at)
	}
	h.Clock.Set(t0.Add(80 * time.Minute))
	rep := h.Run()
	if len(h.Open()) != 0 || rep.ItemsConfirmed != 0 || rep.WindowsUnsettled == 0 {
		t.Fatalf("during the lag: %+v open %+v", rep, h.Open())
	}
	h.Clock.Set(t0.Add(3*time.Hour + time.Minute))
	rep = h.Run()
	if len(h.Open()) != 0 || rep.ItemsConfirmed != 5 {
		t.Fatalf("after the lag: %+v open %+v", rep, h.Open())
	}
}

// An event Stripe answered 200 and rejected later (unknown customer) is
// found: sampled ones as async_rejection, all of them in a
// summary_shortfall, the report's remainder as error_report_unattributed;
// none is confirmed, none resent, and a second run adds nothing.
func TestAsyncRejectionIsFoundAndNeverConfirmed(t *testing.T) {
	t.Parallel()
	h := New(t, Options{Start: t0, SettleLag: 10 * time.Minute, AsyncValidation: true})
	h.Customer("t1", "cus_1", true)
	h.Customer("ghost", "cus_unknown", false) // Stripe does not know it
	var rejected []int64
	for i := 0; i < 5; i++ {
		at := t0.Add(time.Duration(i) * time.Minute)
		h.Clock.Set(at)
		h.Send("t1", "api_calls", Ref(i), 1, at)
		rejected = append(rejected, h.Send("ghost", "api_calls", Ref(100+i), 1, at))
	}
	if n := len(h.Emu.ErrorReports()); n != 5 {
		t.Fatalf("emulator error reports: %d", n)
	}
	ids := h.FlushReports()
	if len(ids) != 1 {
		t.Fatalf("thin events: %v", ids)
	}
	if n := h.Count(`SELECT count(*) FROM billing_events WHERE event_type = 'v1.billing.meter.error_report_triggered' AND processed_at IS NOT NULL`); n != 1 {
		t.Fatalf("stored thin events: %d", n)
	}
	staged := h.Count(`SELECT count(*) FROM outbox_items`)
	h.Clock.Set(t0.Add(90 * time.Minute))
	rep := h.Run()
	kinds := kindsOf(h.Open())
	if kinds[reconciler.KindAsyncRejection] != 3 || kinds[reconciler.KindSummaryShortfall] != 1 || kinds[reconciler.KindErrorReportUnattributed] != 1 {
		t.Fatalf("kinds %v (%+v)", kinds, rep)
	}
	for _, it := range h.Open() {
		if it.Kind == reconciler.KindSummaryShortfall && len(it.ItemIDs) != 5 {
			t.Fatalf("shortfall names %v, want the 5 rejected items", it.ItemIDs)
		}
	}
	if n := h.Count(`SELECT count(*) FROM outbox_items WHERE id = ANY($1) AND state = 'confirmed'`, rejected); n != 0 {
		t.Fatalf("%d rejected items confirmed", n)
	}
	if n := h.Count(`SELECT count(*) FROM outbox_items WHERE state = 'confirmed'`); n != 5 {
		t.Fatalf("confirmed %d, want the 5 good ones", n)
	}
	if got := h.Count(`SELECT count(*) FROM outbox_items`); got != staged {
		t.Fatalf("items restaged: %d → %d", staged, got)
	}
	if rep2 := h.Run(); rep2.FindingsNew != 0 || rep2.FindingsUpdated != 0 || len(h.Open()) != 5 {
		t.Fatalf("second run: %+v", rep2)
	}
}

// A double application injected into the emulator is a summary_excess and
// the window's items are not confirmed.
func TestDoubleApplicationIsSummaryExcess(t *testing.T) {
	t.Parallel()
	h := New(t, Options{Start: t0, SettleLag: 10 * time.Minute})
	h.Customer("t1", "cus_1", true)
	h.Clock.Set(t0.Add(6 * time.Minute))
	id := h.Send("t1", "api_calls", Ref(1), 4, t0.Add(5*time.Minute))
	h.Send("t1", "api_calls", Ref(2), 1, t0.Add(6*time.Minute))
	var key string
	if err := h.Pool.QueryRow(h.Ctx, `SELECT idempotency_key FROM outbox_items WHERE id = $1`, id).Scan(&key); err != nil {
		t.Fatal(err)
	}
	if err := h.Emu.ApplyTwice(key); err != nil {
		t.Fatal(err)
	}
	h.Clock.Set(t0.Add(2 * time.Hour))
	h.Run()
	open := h.Open()
	if len(open) != 1 || open[0].Kind != reconciler.KindSummaryExcess || *open[0].Expected != 5 || *open[0].Observed != 9 {
		t.Fatalf("open %+v", open)
	}
	if n := h.Count(`SELECT count(*) FROM outbox_items WHERE state = 'confirmed'`); n != 0 {
		t.Fatalf("confirmed %d in an excess window", n)
	}
}

// Invoices: usage accepted after its invoice finalized is
// late_after_finalization; a line billing what was not committed is
// invoice_quantity_mismatch; a metered price on a meter no feature maps to
// is unmapped_price. The subscription's periods start at 08:30, not on the
// hour.
func TestInvoiceKinds(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// act runs between subscribing and the run; the period is
		// [08:30, 09:30), finalized at 10:30.
		act  func(h *Harness)
		want map[reconciler.Kind]int
	}{
		{"billed as committed", func(h *Harness) {
			h.Clock.Set(t0.Add(40 * time.Minute))
			h.Send("t1", "api_calls", Ref(1), 3, h.Clock.Now())
		}, map[reconciler.Kind]int{}},
		{"accepted after finalization", func(h *Harness) {
			h.Clock.Set(t0.Add(40 * time.Minute))
			h.Send("t1", "api_calls", Ref(1), 3, h.Clock.Now())
			h.Clock.Set(t0.Add(2*time.Hour + 31*time.Minute)) // after 10:30
			h.Send("t1", "api_calls", Ref(2), 2, t0.Add(50*time.Minute))
		}, map[reconciler.Kind]int{reconciler.KindLateAfterFinalization: 1}},
		{"line bills a double application", func(h *Harness) {
			h.Clock.Set(t0.Add(40 * time.Minute))
			id := h.Send("t1", "api_calls", Ref(1), 3, h.Clock.Now())
			var key string
			if err := h.Pool.QueryRow(h.Ctx, `SELECT idempotency_key FROM outbox_items WHERE id = $1`, id).Scan(&key); err != nil {
				t.Fatal(err)
			}
			if err := h.Emu.ApplyTwice(key); err != nil {
				t.Fatal(err)
			}
		}, map[reconciler.Kind]int{reconciler.KindInvoiceQuantityMismatch: 1, reconciler.KindSummaryExcess: 1}},
		{"price on an unmapped meter", func(h *Harness) {
			m, err := h.Emu.AddMeter(stripemeter("other"))
			if err != nil {
				t.Fatal(err)
			}
			if err := h.Emu.AddMeteredPrice("price_other", m.ID); err != nil {
				t.Fatal(err)
			}
			if _, err := h.Emu.SubscribeMetered("cus_1", "price_other", t0.Add(30*time.Minute), time.Hour); err != nil {
				t.Fatal(err)
			}
			h.Clock.Set(t0.Add(40 * time.Minute))
			h.Send("t1", "api_calls", Ref(1), 3, h.Clock.Now())
		}, map[reconciler.Kind]int{reconciler.KindUnmappedPrice: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := New(t, Options{Start: t0, SettleLag: 10 * time.Minute})
			h.Customer("t1", "cus_1", true)
			if err := h.Emu.AddMeteredPrice("price_api", h.Meters["api_calls"]); err != nil {
				t.Fatal(err)
			}
			if _, err := h.Emu.SubscribeMetered("cus_1", "price_api", t0.Add(30*time.Minute), time.Hour); err != nil {
				t.Fatal(err)
			}
			tt.act(h)
			h.Clock.Set(t0.Add(3 * time.Hour))
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
