package events

import (
	"context"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/shared/clock"
)

// seedStuck makes n dispatched events of typ, each with a processed inbox
// row for every consumer in processedBy.
func (e *env) seedDispatched(typ string, n int, processedBy ...string) []string {
	e.t.Helper()
	ids := e.publish(typ, n)
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `UPDATE event_outbox SET status = 'dispatched', attempts = 1, dispatched_at = now() WHERE event_id = ANY ($1::uuid[])`, ids); err != nil {
		e.t.Fatal(err)
	}
	for _, c := range processedBy {
		if _, err := e.pool.Exec(ctx, `INSERT INTO event_inbox (consumer, event_id, status, attempts, processed_at)
			SELECT $1, unnest($2::uuid[]), 'processed', 1, now()`, c, ids); err != nil {
			e.t.Fatal(err)
		}
	}
	return ids
}

// cleanup-stuck on dispatched-but-processed events: the dry run lists them
// and changes nothing; --yes acknowledges exactly those.
func TestCleanupStuck(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	for _, c := range []string{"ledger", "crm"} {
		if _, err := e.pool.Exec(ctx, sqlRegisterConsumer, c, []string{"InvoicePaid.v1"}); err != nil {
			t.Fatal(err)
		}
	}
	stuck := e.seedDispatched("InvoicePaid.v1", 4, "ledger", "crm")
	half := e.seedDispatched("InvoicePaid.v1", 3, "ledger") // crm still owes these
	none := e.seedDispatched("InvoicePaid.v1", 2)
	orphan := e.seedDispatched("TenantCreated.v1", 1, "ledger") // no consumer registered for the type
	before := e.statuses()

	found, err := CleanupStuck(ctx, e.pool, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	if !sameIDs(found, stuck) {
		t.Fatalf("dry run found %v, want exactly %v", found, stuck)
	}
	if got := e.statuses(); got[StatusDispatched] != before[StatusDispatched] || got[StatusAcknowledged] != 0 {
		t.Fatalf("dry run changed statuses: %v → %v", before, got)
	}
	if len(found[0].ProcessedBy) != 2 {
		t.Errorf("processed_by = %v, want both consumers", found[0].ProcessedBy)
	}
	applied, err := CleanupStuck(ctx, e.pool, nil, true)
	if err != nil || !sameIDs(applied, stuck) {
		t.Fatalf("--yes: %v, %v", applied, err)
	}
	if n := e.count(`SELECT count(*) FROM event_outbox WHERE status = 'acknowledged' AND event_id = ANY ($1::uuid[])`, stuck); n != 4 {
		t.Fatalf("acknowledged %d of the 4 stuck", n)
	}
	rest := append(append(append([]string{}, half...), none...), orphan...)
	if n := e.count(`SELECT count(*) FROM event_outbox WHERE status = 'dispatched' AND event_id = ANY ($1::uuid[])`, rest); n != len(rest) {
		t.Fatalf("%d of the %d others still dispatched", n, len(rest))
	}
	if again, _ := CleanupStuck(ctx, e.pool, nil, false); len(again) != 0 {
		t.Fatalf("a second dry run still finds %d", len(again))
	}
}

func sameIDs(found []StuckEvent, want []string) bool {
	if len(found) != len(want) {
		return false
	}
	set := map[string]bool{}
	for _, w := range want {
		set[w] = true
	}
	for _, f := range found {
		if !set[f.ID] {
			return false
		}
	}
	return true
}

// Purge deletes only acknowledged events older than the retention period,
// with their inbox rows; everything that could still be delivered stays.
func TestPurgeKeepsWhatCanStillBeDelivered(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	cfg := testConfig()
	if _, err := e.pool.Exec(ctx, sqlRegisterConsumer, "ledger", []string{"InvoicePaid.v1"}); err != nil {
		t.Fatal(err)
	}
	old := e.seedDispatched("InvoicePaid.v1", 3, "ledger")
	if _, err := CleanupStuck(ctx, e.pool, nil, true); err != nil { // acknowledged now
		t.Fatal(err)
	}
	dispatched := e.seedDispatched("InvoicePaid.v1", 2)
	e.publish("InvoicePaid.v1", 1) // pending
	clk := clock.NewManual(time.Now())
	if n, err := Purge(ctx, e.pool, cfg, clk); err != nil || n != 0 {
		t.Fatalf("purge inside retention: %d, %v", n, err)
	}
	clk.Advance(cfg.retention() + time.Hour)
	n, err := Purge(ctx, e.pool, cfg, clk)
	if err != nil || n != 3 {
		t.Fatalf("purge after retention: %d, %v; want the 3 acknowledged", n, err)
	}
	if n := e.count(`SELECT count(*) FROM event_inbox WHERE event_id = ANY ($1::uuid[])`, old); n != 0 {
		t.Fatalf("%d inbox rows of purged events left", n)
	}
	if n := e.count(`SELECT count(*) FROM event_outbox WHERE event_id = ANY ($1::uuid[])`, dispatched); n != 2 {
		t.Fatal("a dispatched event was purged")
	}
	if n := e.count(`SELECT count(*) FROM event_outbox`); n != 3 {
		t.Fatalf("outbox rows left = %d, want 3 (2 dispatched, 1 pending)", n)
	}
}

func TestListAndInspect(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	for _, c := range []string{"ledger", "crm"} {
		if _, err := e.pool.Exec(ctx, sqlRegisterConsumer, c, []string{"InvoicePaid.v1"}); err != nil {
			t.Fatal(err)
		}
	}
	ids := e.seedDispatched("InvoicePaid.v1", 2, "ledger")
	e.publish("SubscriptionChanged.v1", 1)
	rows, err := List(ctx, e.pool, ListFilter{Status: StatusDispatched})
	if err != nil || len(rows) != 2 {
		t.Fatalf("List dispatched: %d, %v", len(rows), err)
	}
	if _, err := List(ctx, e.pool, ListFilter{Status: "bogus"}); err == nil {
		t.Fatal("List accepted an unknown status")
	}
	d, err := Inspect(ctx, e.pool, ids[0], false)
	if err != nil {
		t.Fatal(err)
	}
	if d.Payload != nil || len(d.Inbox) != 1 || len(d.Waiting) != 1 || d.Waiting[0] != "crm" {
		t.Fatalf("Inspect: %+v", d)
	}
	if d, _ := Inspect(ctx, e.pool, ids[0], true); len(d.Payload) == 0 {
		t.Fatal("Inspect --show-payload without the payload")
	}
	if _, err := Inspect(ctx, e.pool, NewID(), false); err == nil {
		t.Fatal("Inspect of an unknown id succeeded")
	}
}
