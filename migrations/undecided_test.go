package migrations_test

import (
	"context"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/migrations"
	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/jackc/pgx/v5"
)

// 00311's backfill of outbox_undecided waits for a staging transaction that
// is open when the migration starts (LOCK TABLE before the backfill reads):
// the item that transaction commits has its row once 00311 is applied. A
// backfill that read first and locked later would miss it, and the
// re-dispatch sweep and the pending gauges would never see the item.
func TestUndecidedBackfillWaitsForStagingTransactions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.NewEmptyDatabase(t)
	if err := migrations.UpTo(ctx, url, 310); err != nil {
		t.Fatal(err)
	}
	stager, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer stager.Close(ctx)
	tx, err := stager.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var id int64
	if err := tx.QueryRow(ctx, `INSERT INTO outbox_items (tenant, subject_kind, subject_ref, exporter, destination_account, mode,
		mapping_version, idempotency_key, feature, quantity, occurred_at, period_start)
		VALUES ('org_a', 'event', 'ev1', 'stripe', 'acct_1', 'test', 1, '', 'api_calls', 1, now(), date_trunc('hour', now()))
		RETURNING id`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- migrations.UpTo(ctx, url, 311) }()
	watch, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close(ctx)
	for deadline := time.Now().Add(10 * time.Second); ; {
		var waiting bool
		if err := watch.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock')`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the migration never waited for the staging transaction")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var tracked bool
	if err := watch.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM outbox_undecided WHERE item_id = $1)`, id).Scan(&tracked); err != nil {
		t.Fatal(err)
	}
	if !tracked {
		t.Fatalf("item %d staged while 00311 ran has no outbox_undecided row", id)
	}
}
