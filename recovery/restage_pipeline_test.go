package recovery_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/internal/pipelinetest"
	"github.com/aurora-billing/aurora/provision"
	"github.com/aurora-billing/aurora/recovery"
	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/aurora-billing/aurora/shared/usage"
	"github.com/jackc/pgx/v5"
)

// Must show (issue 22): a feature remapped while items are staged; the
// deliverer quarantines them feature_unmapped, requeue is refused
// mapping_changed, restage rebuilds each for the new version under its
// original key, and the provider applies each key exactly once, on the new
// meter. Re-recording an event then returns the rebuilt item.
func TestRestageAfterRemapDeliversOriginalKeysOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := pipelinetest.New(t)
	v1 := p.Meter("api_calls")
	p.Customer("org_remap")
	gate := usage.Gate{Recorder: usage.Recorder{DestinationAccount: pipelinetest.Account, Mode: identity.ModeTest, Period: usage.PeriodDay},
		Sources: usage.Sources{"api_calls": usage.SourceEvents}}
	now := time.Now().UTC().Truncate(time.Second)
	keys := map[int64]string{} // old item id -> key
	var events []usage.Event
	for i := range 3 {
		ev := usage.Event{Tenant: "org_remap", EventID: fmt.Sprintf("req-%d", i), Feature: "api_calls", Quantity: int64(i + 1), OccurredAt: now}
		events = append(events, ev)
		if err := pgx.BeginFunc(ctx, p.Pool, func(tx pgx.Tx) error {
			row, _, err := gate.Record(ctx, tx, ev)
			keys[row.ID] = row.IdempotencyKey
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	// The remap, before anything was sent.
	v2, err := provision.Meter(ctx, p.Pool, p.API, pipelinetest.Account, "api_calls", "aurora_api_calls_v2")
	if err != nil {
		t.Fatal(err)
	}
	if v2.MappingVersion != v1.MappingVersion+1 {
		t.Fatalf("remap: version %d -> %d", v1.MappingVersion, v2.MappingVersion)
	}
	p.Start()
	p.Settle()
	svc := recovery.New(p.Pool, recovery.Config{})
	for id := range keys {
		row, err := svc.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if row.State != outbox.StateQuarantined || *row.QuarantineReason != outbox.ReasonFeatureUnmapped {
			t.Fatalf("item %d after the remap: %s %v", id, row.State, row.QuarantineReason)
		}
		if _, err := svc.Requeue(ctx, id, recovery.RequeueInput{Expected: recovery.ExpectedOf(row), Reason: "try", Actor: "ops"}); !errors.Is(err, recovery.ErrMappingChanged) {
			t.Fatalf("requeue across the remap: %v", err)
		}
	}
	if n := p.Emulator.AppliedCount(); n != 0 {
		t.Fatalf("%d applied before the restage", n)
	}

	cands, err := svc.Restageable(ctx, recovery.RestageFilter{DestinationAccount: pipelinetest.Account, Feature: "api_calls"})
	if err != nil || len(cands) != 3 {
		t.Fatalf("restageable: %d, %v", len(cands), err)
	}
	newIDs := map[int64]bool{}
	for _, row := range cands {
		in := recovery.RestageInput{Expected: recovery.ExpectedOf(row), Reason: "api_calls remapped to the v2 meter",
			Evidence: "provision meter: " + v2.MeterID + " mapping_version 2", Actor: "ops"}
		pv, err := svc.PreviewRestage(ctx, row.ID, in)
		if err != nil || pv.Change.Rebuild == nil || pv.Change.Rebuild.IdempotencyKey != keys[row.ID] || pv.Change.Rebuild.MappingVersionTo != v2.MappingVersion {
			t.Fatalf("preview: %+v %v", pv.Change, err)
		}
		res, err := svc.Restage(ctx, row.ID, in)
		if err != nil {
			t.Fatal(err)
		}
		if res.Restaged == nil || res.Restaged.IdempotencyKey != keys[row.ID] || res.Restaged.MappingVersion != v2.MappingVersion ||
			res.Item.State != outbox.StateRejected || !res.Action.Applied || res.Action.Action != recovery.KindRestage {
			t.Fatalf("restage: %+v", res)
		}
		newIDs[res.Restaged.ID] = true
		// A second restage of the same item is refused (it left quarantined).
		if _, err := svc.Restage(ctx, row.ID, in); !errors.Is(err, recovery.ErrInvalidExpected) && !errors.Is(err, recovery.ErrExpectedStateMismatch) {
			t.Fatalf("second restage: %v", err)
		}
	}
	p.Settle()
	for id, key := range keys {
		if n := p.Emulator.Applications(key); n != 1 {
			t.Fatalf("item %d's key applied %d times, want exactly once", id, n)
		}
	}
	if n := p.Emulator.AppliedCount(); n != 3 {
		t.Fatalf("applied %d, want 3", n)
	}
	for _, ev := range p.Emulator.Applied() {
		if ev.EventName != "aurora_api_calls_v2" {
			t.Fatalf("applied on %s, want the new meter", ev.EventName)
		}
	}
	var accepted int
	if err := p.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox_items WHERE state = 'accepted' AND id = ANY($1)`, keysOf(newIDs)).Scan(&accepted); err != nil || accepted != 3 {
		t.Fatalf("rebuilt items accepted: %d, %v", accepted, err)
	}
	// The usage fact follows the rebuilt item.
	if err := pgx.BeginFunc(ctx, p.Pool, func(tx pgx.Tx) error {
		row, created, err := gate.Record(ctx, tx, events[0])
		if err == nil && (created || !newIDs[row.ID]) {
			err = fmt.Errorf("re-recording returned item %d (created %v), want a rebuilt one", row.ID, created)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

func keysOf(m map[int64]bool) []int64 {
	out := make([]int64, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
