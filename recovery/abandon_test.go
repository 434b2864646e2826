package recovery_test

import (
	"context"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/recovery"
	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/aurora-billing/aurora/shared/usage"
	"github.com/jackc/pgx/v5"
)

func event(id string) usage.Event {
	return usage.Event{Tenant: "org_123", EventID: id, Feature: "api_calls", Quantity: 7, OccurredAt: sept.Add(10 * time.Hour)}
}

func abandonInput(e recovery.Expected) recovery.AbandonInput {
	return recovery.AbandonInput{
		Expected: e, Reason: "no meter event for this identifier in the request logs",
		Evidence: "searched 2026-09-15 09:00Z to 10:00Z, 0 results", Actor: "ana",
	}
}

// Abandon then restage (a window): the old item stays rejected; the same
// bounds restage under a new identity with a new key.
func TestAbandonWindowThenRestageGivesNewKey(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	old := f.makeUncertain(f.stageWindow("org_123", 0, 5, 0).ID, 3)

	res, err := f.svc.Abandon(f.ctx, old.ID, abandonInput(recovery.ExpectedOf(old)))
	if err != nil {
		t.Fatal(err)
	}
	if res.Item.State != outbox.StateRejected || res.Restaged != nil {
		t.Fatalf("result %+v", res)
	}
	var gen int
	var staged *int64
	if err := f.pool.QueryRow(f.ctx, `SELECT generation, staged_item_id FROM usage_windows WHERE tenant = 'org_123'`).Scan(&gen, &staged); err != nil {
		t.Fatal(err)
	}
	if gen != 1 || staged != nil {
		t.Fatalf("window generation %d staged %v, want 1 and NULL", gen, staged)
	}
	w := res.Change.Window
	wantRef := "usage:api_calls:2026-09-01T00:00:00Z:0:5:r1"
	if w == nil || w.GenerationTo != 1 || w.SameBoundsSubjectRef != wantRef {
		t.Fatalf("change %+v", w)
	}

	// The buffered reporter restages the unchanged bounds with the new
	// generation (usage.WindowSubjectRef is the shared contract).
	again := f.stageWindow("org_123", 0, 5, gen)
	if again.ID == old.ID || again.SubjectRef != wantRef || again.IdempotencyKey == old.IdempotencyKey ||
		again.IdempotencyKey != w.SameBoundsKey || again.State != outbox.StatePending {
		t.Fatalf("restaged %d %q %s, old %d %s", again.ID, again.SubjectRef, again.IdempotencyKey, old.ID, old.IdempotencyKey)
	}
	if got := f.get(old.ID); got.State != outbox.StateRejected {
		t.Fatalf("old item %s, want rejected", got.State)
	}
	// Restaging generation 0 again would collapse onto the rejected row,
	// which is why the generation must move.
	if collapsed := f.stageWindowItemOnly("org_123", 0, 5, 0); collapsed.ID != old.ID || collapsed.State != outbox.StateRejected {
		t.Fatalf("generation 0 staged as %d %s", collapsed.ID, collapsed.State)
	}
}

func (f *fixture) stageWindowItemOnly(tenant string, from, to int64, generation int) outbox.Row {
	f.t.Helper()
	var row outbox.Row
	err := pgx.BeginFunc(f.ctx, f.pool, func(tx pgx.Tx) error {
		var err error
		row, err = outbox.Stage(f.ctx, tx, windowItem(tenant, from, to, generation))
		return err
	})
	if err != nil {
		f.t.Fatal(err)
	}
	return row
}

// Abandon then restage (a durable event): the event is restaged in the same
// transaction as event:<id>:r1 with a new key, the event's link moves to it,
// and recording the event again returns the new item.
func TestAbandonEventRestagesUnderNewIdentity(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.mapFeature("api_calls", 2)
	old := f.makeUncertain(f.record(event("req-1")).ID, 2)
	if old.SubjectRef != "event:req-1" {
		t.Fatalf("subject ref %q", old.SubjectRef)
	}

	preview, err := f.svc.PreviewAbandon(f.ctx, old.ID, abandonInput(recovery.ExpectedOf(old)))
	if err != nil {
		t.Fatal(err)
	}
	res, err := f.svc.Abandon(f.ctx, old.ID, abandonInput(recovery.ExpectedOf(old)))
	if err != nil {
		t.Fatal(err)
	}
	n := res.Restaged
	if n == nil || n.ID == old.ID || n.SubjectRef != "event:req-1:r1" || n.IdempotencyKey == old.IdempotencyKey ||
		n.State != outbox.StatePending || n.Quantity != old.Quantity || !n.OccurredAt.Equal(old.OccurredAt) ||
		n.MappingVersion != 2 || n.SubjectKind != identity.SubjectEvent {
		t.Fatalf("restaged %+v", n)
	}
	if preview.Change.Restage == nil || preview.Change.Restage.IdempotencyKey != n.IdempotencyKey ||
		res.Change.Restage.ItemID != n.ID {
		t.Fatalf("preview %+v result %+v", preview.Change.Restage, res.Change.Restage)
	}
	if got := f.get(old.ID); got.State != outbox.StateRejected {
		t.Fatalf("old %s", got.State)
	}
	var linked int64
	if err := f.pool.QueryRow(f.ctx, `SELECT item_id FROM usage_events WHERE event_id = 'req-1'`).Scan(&linked); err != nil {
		t.Fatal(err)
	}
	if linked != n.ID {
		t.Fatalf("event links %d, want %d", linked, n.ID)
	}
	// An application replaying the event gets the new item, not a third.
	if again := f.record(event("req-1")); again.ID != n.ID {
		t.Fatalf("replay returned %d, want %d", again.ID, n.ID)
	}
	// Abandoning the restaged item too moves to r2.
	n2 := f.makeUncertain(n.ID, 1)
	res2, err := f.svc.Abandon(f.ctx, n2.ID, abandonInput(recovery.ExpectedOf(n2)))
	if err != nil {
		t.Fatal(err)
	}
	if res2.Restaged == nil || res2.Restaged.SubjectRef != "event:req-1:r2" {
		t.Fatalf("second restage %+v", res2.Restaged)
	}
	if c := f.count(`SELECT count(*) FROM outbox_items WHERE state = 'rejected'`); c != 2 {
		t.Fatalf("%d rejected", c)
	}
}

// An event whose id happens to look like a generation ("req-1:r1") owns
// that identity; restaging "req-1" skips to the next free generation, and
// abandoning the look-alike restages the right event.
func TestAbandonEventSkipsTakenGeneration(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	first := f.makeUncertain(f.record(event("req-1")).ID, 1)
	lookalike := f.record(event("req-1:r1"))
	res, err := f.svc.Abandon(f.ctx, first.ID, abandonInput(recovery.ExpectedOf(first)))
	if err != nil {
		t.Fatal(err)
	}
	if res.Restaged.SubjectRef != "event:req-1:r2" || res.Restaged.ID == lookalike.ID {
		t.Fatalf("restaged as %q (%d)", res.Restaged.SubjectRef, res.Restaged.ID)
	}
	la := f.makeUncertain(lookalike.ID, 1)
	res, err = f.svc.Abandon(f.ctx, la.ID, abandonInput(recovery.ExpectedOf(la)))
	if err != nil {
		t.Fatal(err)
	}
	if res.Restaged.SubjectRef != "event:req-1:r1:r1" || res.Change.Restage.EventID != "req-1:r1" {
		t.Fatalf("look-alike restaged as %q for %q", res.Restaged.SubjectRef, res.Change.Restage.EventID)
	}
}

func TestAbandonCorrection(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.record(event("req-1"))
	c := event("fix-1")
	c.CorrectsEventID, c.Quantity = "req-1", -2
	item := f.makeUncertain(f.record(c).ID, 1)
	res, err := f.svc.Abandon(f.ctx, item.ID, abandonInput(recovery.ExpectedOf(item)))
	if err != nil {
		t.Fatal(err)
	}
	if res.Restaged == nil || res.Restaged.SubjectRef != "correction:fix-1:r1" || res.Restaged.Quantity != -2 ||
		res.Restaged.SubjectKind != identity.SubjectCorrection {
		t.Fatalf("restaged %+v", res.Restaged)
	}
}

// An item no usage fact links is rejected and nothing restages.
func TestAbandonUnlinkedItem(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	item := f.makeUncertain(f.stageWindowItemOnly("org_9", 0, 3, 0).ID, 1)
	res, err := f.svc.Abandon(f.ctx, item.ID, abandonInput(recovery.ExpectedOf(item)))
	if err != nil {
		t.Fatal(err)
	}
	if res.Item.State != outbox.StateRejected || res.Change.Window != nil || res.Change.Restage != nil || res.Restaged != nil {
		t.Fatalf("result %+v", res)
	}
	if c := f.count(`SELECT count(*) FROM outbox_items`); c != 1 {
		t.Fatalf("%d items", c)
	}
}

// Preview writes nothing: no action, no row change, no restaged item.
func TestPreviewWritesNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	item := f.makeUncertain(f.record(event("req-1")).ID, 2)
	p, err := f.svc.PreviewAbandon(context.Background(), item.ID, abandonInput(recovery.ExpectedOf(item)))
	if err != nil {
		t.Fatal(err)
	}
	if p.Change.To != outbox.StateRejected || p.Change.Restage == nil || p.Change.Restage.SubjectRef != "event:req-1:r1" || p.Item.ID != item.ID {
		t.Fatalf("preview %+v", p)
	}
	if _, err := f.svc.PreviewAcknowledge(f.ctx, item.ID, ackInput(recovery.ExpectedOf(item))); err != nil {
		t.Fatal(err)
	}
	if c := f.count(`SELECT (SELECT count(*) FROM recovery_actions) + (SELECT count(*) FROM outbox_items)`); c != 1 {
		t.Fatalf("preview wrote: %d rows", c)
	}
	if got := f.get(item.ID); got.State != outbox.StateUncertain || !got.UpdatedAt.Equal(item.UpdatedAt) {
		t.Fatalf("row changed")
	}
}
