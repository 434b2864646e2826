package recovery_test

import (
	"errors"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/recovery"
	"github.com/aurora-billing/aurora/shared/outbox"
)

func requeueInput(e recovery.Expected) recovery.RequeueInput {
	return recovery.RequeueInput{Expected: e, Reason: "customer linked in tenant_billing", Actor: "liam"}
}

func TestRequeuePutsQuarantinedBackToPending(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.mapFeature("api_calls", 1)
	item := f.makeQuarantined(f.stageWindow("org_123", 0, 5, 0).ID, outbox.ReasonCustomerMissing)
	if item.MappingVersion != 1 {
		t.Fatalf("mapping version %d", item.MappingVersion)
	}
	res, err := f.svc.Requeue(f.ctx, item.ID, requeueInput(recovery.ExpectedOf(item)))
	if err != nil {
		t.Fatal(err)
	}
	got := f.get(item.ID)
	if got.State != outbox.StatePending || got.QuarantineReason != nil || got.Dispatch != item.Dispatch+1 ||
		got.PublishedDispatch >= got.Dispatch || !got.NextAttemptAt.Equal(testNow) {
		t.Fatalf("row %s reason %v dispatch %d/%d next %v", got.State, got.QuarantineReason, got.PublishedDispatch, got.Dispatch, got.NextAttemptAt)
	}
	if got.Attempts != item.Attempts || got.FirstAttemptAt == nil || got.LeaseToken != item.LeaseToken {
		t.Fatalf("requeue reset attempts or horizon: %+v", got)
	}
	if !res.Action.Applied || res.Action.Action != recovery.KindRequeue || res.Action.Evidence != "" ||
		jsonField(t, res.Action.Observed, "current_mapping_version") != float64(1) {
		t.Fatalf("action %+v", res.Action)
	}
	if res.Change.ClearQuarantineReason == nil || *res.Change.ClearQuarantineReason != outbox.ReasonCustomerMissing {
		t.Fatalf("change %+v", res.Change)
	}
}

func TestRequeueRefusedWhenMappingChanged(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		before, after int32 // mapping version when staged (0 = unmapped), and now
	}{
		"feature mapped since (item version 0)": {0, 1},
		"mapping moved":                         {1, 2},
		"mapping removed":                       {1, 0},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			if tt.before > 0 {
				f.mapFeature("api_calls", tt.before)
			}
			item := f.makeQuarantined(f.record(event("req-1")).ID, outbox.ReasonFeatureUnmapped)
			if item.MappingVersion != tt.before {
				t.Fatalf("staged with %d", item.MappingVersion)
			}
			if tt.after > 0 {
				f.mapFeature("api_calls", tt.after)
			} else {
				f.exec(`DELETE FROM meter_mappings`)
			}
			in := requeueInput(recovery.ExpectedOf(item))
			if _, err := f.svc.PreviewRequeue(f.ctx, item.ID, in); !errors.Is(err, recovery.ErrMappingChanged) {
				t.Fatalf("preview: got %v", err)
			}
			res, err := f.svc.Requeue(f.ctx, item.ID, in)
			var mc *recovery.MappingChangedError
			if !errors.Is(err, recovery.ErrMappingChanged) || !errors.As(err, &mc) || mc.ItemVersion != tt.before || mc.CurrentVersion != tt.after {
				t.Fatalf("got %v", err)
			}
			if got := f.get(item.ID); got.State != outbox.StateQuarantined || got.Dispatch != item.Dispatch {
				t.Fatalf("row moved to %s", got.State)
			}
			a := f.actions(item.ID)
			if len(a) != 1 || a[0].ID != res.Action.ID || a[0].Applied || *a[0].Refusal != recovery.RefusalMappingChanged ||
				jsonField(t, a[0].Observed, "current_mapping_version") != float64(tt.after) {
				t.Fatalf("actions %+v", a)
			}
		})
	}
}

func TestRequeueUnchangedUnmappedIsAllowed(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	item := f.makeQuarantined(f.record(event("req-1")).ID, outbox.ReasonFeatureUnmapped)
	if _, err := f.svc.Requeue(f.ctx, item.ID, requeueInput(recovery.ExpectedOf(item))); err != nil {
		t.Fatal(err)
	}
}

func TestRequeueRefusesNonQuarantined(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	item := f.makeUncertain(f.record(event("req-1")).ID, 1)
	// expected says uncertain: requeue does not start there
	if _, err := f.svc.Requeue(f.ctx, item.ID, requeueInput(recovery.ExpectedOf(item))); !errors.Is(err, recovery.ErrInvalidExpected) {
		t.Fatalf("got %v", err)
	}
	// expected says quarantined, the row is uncertain: a mismatch
	e := recovery.ExpectedOf(item)
	e.State = outbox.StateQuarantined
	_, err := f.svc.Requeue(f.ctx, item.ID, requeueInput(e))
	var mm *recovery.ExpectedStateMismatchError
	if !errors.As(err, &mm) || mm.Current.State != outbox.StateUncertain {
		t.Fatalf("got %v", err)
	}
	if n := len(f.actions(item.ID)); n != 2 {
		t.Fatalf("%d actions", n)
	}
}

// TestRequeuePeriodBuffered: an item quarantined period_buffered is billed
// by the buffered counters until a cutover watermark puts its period in the
// recording era; requeueing it before that would bill the period twice.
func TestRequeuePeriodBuffered(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		watermark string // '' = none scheduled; tenant-wide rows are org_123's
		global    bool   // the watermark row is the global one (tenant '')
		refused   bool
	}{
		{name: "no watermark", refused: true},
		{name: "period before the watermark", watermark: "2026-09-02T00:00:00Z", refused: true},
		{name: "period on the global watermark", watermark: "2026-09-01T00:00:00Z", global: true},
		{name: "period after the watermark", watermark: "2026-08-01T00:00:00Z"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			f.mapFeature("api_calls", 1)
			item := f.makeQuarantined(f.record(event("req-b")).ID, outbox.ReasonPeriodBuffered)
			if !item.PeriodStart.Equal(time.Date(2026, 9, 1, 0, 0, 0, 0, time.UTC)) {
				t.Fatalf("fixture period %s", item.PeriodStart)
			}
			if tt.watermark != "" {
				tenant := "org_123"
				if tt.global {
					tenant = ""
				}
				f.exec(`INSERT INTO usage_cutovers (tenant, feature, watermark, scheduled_by) VALUES ($1, 'api_calls', $2, 'test')`, tenant, tt.watermark)
			}
			res, err := f.svc.Requeue(f.ctx, item.ID, requeueInput(recovery.ExpectedOf(item)))
			if !tt.refused {
				if err != nil || f.get(item.ID).State != outbox.StatePending {
					t.Fatalf("requeue: %v, state %s", err, f.get(item.ID).State)
				}
				if jsonField(t, res.Action.Observed, "watermark") == nil {
					t.Fatalf("the watermark decided but is not in the observed state: %s", res.Action.Observed)
				}
				return
			}
			var sb *recovery.StillBufferedError
			if !errors.As(err, &sb) || !errors.Is(err, recovery.ErrStillBuffered) || recovery.RefusalOf(err) != recovery.RefusalStillBuffered {
				t.Fatalf("got %v, want still_buffered", err)
			}
			if (tt.watermark == "") != (sb.Watermark == nil) {
				t.Fatalf("watermark in the refusal: %v", sb.Watermark)
			}
			if got := f.get(item.ID); got.State != outbox.StateQuarantined {
				t.Fatalf("refused requeue moved the item to %s", got.State)
			}
			acts := f.actions(item.ID)
			if len(acts) != 1 || acts[0].Applied || acts[0].Refusal == nil || *acts[0].Refusal != recovery.RefusalStillBuffered {
				t.Fatalf("refusal not recorded: %+v", acts)
			}
		})
	}
}
