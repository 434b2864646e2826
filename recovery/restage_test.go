package recovery_test

import (
	"errors"
	"testing"

	"github.com/aurora-billing/aurora/recovery"
	"github.com/aurora-billing/aurora/shared/outbox"
)

func restageInput(e recovery.Expected) recovery.RestageInput {
	return recovery.RestageInput{Expected: e, Reason: "api_calls remapped", Evidence: "mapping_version 2 on mtr_2", Actor: "liam"}
}

// A window item's link (usage_windows.staged_item_id) moves to the rebuilt
// item; the audit row names both.
func TestRestageMovesTheWindowLink(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.mapFeature("api_calls", 1)
	item := f.makeQuarantined(f.stageWindow("org_123", 0, 5, 0).ID, outbox.ReasonFeatureUnmapped)
	f.mapFeature("api_calls", 2)
	res, err := f.svc.Restage(f.ctx, item.ID, restageInput(recovery.ExpectedOf(item)))
	if err != nil {
		t.Fatal(err)
	}
	nw := res.Restaged
	if nw == nil || nw.IdempotencyKey != item.IdempotencyKey || nw.MappingVersion != 2 || nw.Dispatch != item.Dispatch+1 || nw.State != outbox.StatePending {
		t.Fatalf("rebuilt %+v", nw)
	}
	if got := f.get(item.ID); got.State != outbox.StateRejected || got.QuarantineReason != nil || got.LastError == nil {
		t.Fatalf("old item %s %v", got.State, got.QuarantineReason)
	}
	if n := f.count(`SELECT count(*) FROM usage_windows WHERE staged_item_id = $1`, nw.ID); n != 1 {
		t.Fatalf("window link on the rebuilt item: %d", n)
	}
	acts := f.actions(item.ID)
	if len(acts) != 1 || !acts[0].Applied || acts[0].Action != recovery.KindRestage || acts[0].Evidence == "" ||
		jsonField(t, acts[0].Observed, "current_mapping_version") != float64(2) {
		t.Fatalf("actions %+v", acts)
	}
}

func TestRestageRefusals(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		staged, now int32 // mapping version at stage time and now (0 = unmapped)
		reason      outbox.Reason
		input       func(recovery.Expected) recovery.RestageInput
		rebuilt     bool // an item for the current version already exists
		want        error
		refusal     recovery.Refusal
	}{
		"mapping unchanged": {1, 1, outbox.ReasonCustomerMissing, restageInput, false, recovery.ErrMappingUnchanged, recovery.RefusalMappingUnchanged},
		"not mapped now":    {1, 0, outbox.ReasonFeatureUnmapped, restageInput, false, recovery.ErrNotMapped, recovery.RefusalNotMapped},
		"already restaged":  {1, 2, outbox.ReasonFeatureUnmapped, restageInput, true, recovery.ErrAlreadyRestaged, recovery.RefusalAlreadyRestaged},
		"still buffered":    {1, 2, outbox.ReasonPeriodBuffered, restageInput, false, recovery.ErrStillBuffered, recovery.RefusalStillBuffered},
		"blank evidence": {1, 2, outbox.ReasonFeatureUnmapped, func(e recovery.Expected) recovery.RestageInput {
			in := restageInput(e)
			in.Evidence = " "
			return in
		}, false, recovery.ErrInvalidEvidence, recovery.RefusalInvalidEvidence},
		"stale screen": {1, 2, outbox.ReasonFeatureUnmapped, func(e recovery.Expected) recovery.RestageInput {
			e.LeaseToken++
			return restageInput(e)
		}, false, recovery.ErrExpectedStateMismatch, recovery.RefusalExpectedStateMismatch},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			f.mapFeature("api_calls", tt.staged)
			item := f.makeQuarantined(f.record(event("req-1")).ID, tt.reason)
			if tt.now == 0 {
				f.exec(`DELETE FROM meter_mappings`)
			} else {
				f.mapFeature("api_calls", tt.now)
			}
			if tt.rebuilt {
				f.exec(`INSERT INTO outbox_items (tenant, subject_kind, subject_ref, exporter, destination_account, mode, mapping_version,
					idempotency_key, feature, quantity, occurred_at, period_start)
					SELECT tenant, subject_kind, subject_ref, exporter, destination_account, mode, $2, '', feature, quantity, occurred_at, period_start
					FROM outbox_items WHERE id = $1`, item.ID, tt.now)
			}
			in := tt.input(recovery.ExpectedOf(item))
			if _, err := f.svc.PreviewRestage(f.ctx, item.ID, in); !errors.Is(err, tt.want) {
				t.Fatalf("preview: %v, want %v", err, tt.want)
			}
			res, err := f.svc.Restage(f.ctx, item.ID, in)
			if !errors.Is(err, tt.want) || recovery.RefusalOf(err) != tt.refusal {
				t.Fatalf("got %v (%q), want %v", err, recovery.RefusalOf(err), tt.want)
			}
			if res.Action.Applied || res.Action.Refusal == nil || *res.Action.Refusal != tt.refusal {
				t.Fatalf("refusal not recorded: %+v", res.Action)
			}
			if got := f.get(item.ID); got.State != outbox.StateQuarantined {
				t.Fatalf("row moved to %s", got.State)
			}
			want := 1
			if tt.rebuilt {
				want = 2
			}
			if n := f.count(`SELECT count(*) FROM outbox_items`); n != want {
				t.Fatalf("%d items, want %d", n, want)
			}
		})
	}
}
