package recovery_test

import (
	"errors"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/recovery"
	"github.com/aurora-billing/aurora/shared/clock"
	"github.com/aurora-billing/aurora/shared/outbox"
)

func TestListUncertainByAgeAndLimit(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	// updated_at is the database's now(); the service clock is set two
	// hours ahead of it, so nothing sleeps.
	f.clock.Set(time.Now().Add(2 * time.Hour))
	a := f.makeUncertain(f.record(event("a")).ID, 1)
	b := f.makeUncertain(f.record(event("b")).ID, 1)
	f.makeQuarantined(f.record(event("c")).ID, outbox.ReasonCustomerMissing)
	f.record(event("d")) // pending

	got, err := f.svc.ListUncertain(f.ctx, time.Hour, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].ID != a.ID || got[1].ID != b.ID {
		t.Fatalf("got %d items", len(got))
	}
	if got, _ := f.svc.ListUncertain(f.ctx, 3*time.Hour, 10); len(got) != 0 {
		t.Fatalf("older than 3h: %d items", len(got))
	}
	if got, _ := f.svc.ListUncertain(f.ctx, 0, 1); len(got) != 1 || got[0].ID != a.ID {
		t.Fatalf("limit 1: %d items", len(got))
	}
	q, err := f.svc.List(f.ctx, recovery.ListParams{State: outbox.StateQuarantined, Reason: outbox.ReasonCustomerMissing})
	if err != nil || len(q) != 1 || q[0].State != outbox.StateQuarantined {
		t.Fatalf("quarantined: %v %d", err, len(q))
	}
	if q, _ := f.svc.List(f.ctx, recovery.ListParams{State: outbox.StateQuarantined, Reason: outbox.ReasonFeatureUnmapped}); len(q) != 0 {
		t.Fatalf("reason filter: %d", len(q))
	}
	// the database clock (no override): just-updated items are not an hour old
	db := recovery.New(f.pool, recovery.Config{Clock: clock.DB{}})
	if got, _ := db.ListUncertain(f.ctx, time.Hour, 10); len(got) != 0 {
		t.Fatalf("db clock: %d", len(got))
	}
	if got, _ := db.ListUncertain(f.ctx, 0, 10); len(got) != 2 {
		t.Fatalf("db clock, any age: %d", len(got))
	}
}

func TestListRejectsBadQueries(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for _, p := range []recovery.ListParams{
		{State: outbox.StatePending},
		{State: "done"},
		{OlderThan: -time.Second},
		{Limit: -1},
		{Limit: recovery.MaxLimit + 1},
		{State: outbox.StateUncertain, Reason: outbox.ReasonCustomerMissing},
		{State: outbox.StateQuarantined, Reason: "bogus"},
	} {
		if _, err := f.svc.List(f.ctx, p); !errors.Is(err, recovery.ErrInvalidQuery) {
			t.Errorf("%+v: got %v", p, err)
		}
	}
}

func TestInspect(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.mapFeature("api_calls", 4)
	item := f.makeUncertain(f.stageWindow("org_123", 0, 5, 0).ID, 3)
	in := ackInput(recovery.ExpectedOf(item))
	in.Reason = ""
	if _, err := f.svc.Acknowledge(f.ctx, item.ID, in); !errors.Is(err, recovery.ErrInvalidReason) {
		t.Fatal(err)
	}
	ins, err := f.svc.Inspect(f.ctx, item.ID)
	if err != nil {
		t.Fatal(err)
	}
	if ins.Item.ID != item.ID || ins.SearchIdentifier != item.IdempotencyKey || len(ins.SearchIdentifier) != 64 {
		t.Fatalf("identifier %q", ins.SearchIdentifier)
	}
	if len(ins.Attempts) != 3 || ins.Attempts[2].Outcome == nil || *ins.Attempts[2].Outcome != "uncertain" || ins.Attempts[0].LeaseToken != 1 {
		t.Fatalf("attempts %+v", ins.Attempts)
	}
	if len(ins.Actions) != 1 || *ins.Actions[0].Refusal != recovery.RefusalInvalidReason {
		t.Fatalf("actions %+v", ins.Actions)
	}
	if ins.CurrentMappingVersion != 4 || ins.Link == nil || ins.Link.Kind != recovery.LinkUsageWindow || *ins.Link.Generation != 0 {
		t.Fatalf("mapping %d link %+v", ins.CurrentMappingVersion, ins.Link)
	}
	if ins.Expected != (recovery.Expected{State: outbox.StateUncertain, LeaseToken: 3, SubjectRef: item.SubjectRef}) {
		t.Fatalf("expected %+v", ins.Expected)
	}
	ev := f.record(event("req-1"))
	ins, err = f.svc.Inspect(f.ctx, ev.ID)
	if err != nil || ins.Link == nil || ins.Link.Kind != recovery.LinkUsageEvent || ins.Link.EventID != "req-1" ||
		len(ins.Attempts) != 0 || len(ins.Actions) != 0 {
		t.Fatalf("%v %+v", err, ins)
	}
}
