package relay

import (
	"context"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/shared/clock"
	"github.com/aurora-billing/aurora/shared/natstest"
	"github.com/jackc/pgx/v5/pgxpool"
)

// undecided returns outbox_undecided's rows: item id → generation.
func undecided(t *testing.T, pool *pgxpool.Pool) map[int64]int32 {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT item_id, generation FROM outbox_undecided`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := map[int64]int32{}
	for rows.Next() {
		var id int64
		var g int32
		if err := rows.Scan(&id, &g); err != nil {
			t.Fatal(err)
		}
		got[id] = g
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return got
}

// outbox_undecided (migration 00311) holds every staged item; the sweep
// trims the rows of items that left pending and leased and keeps the rest;
// an item that moves back into pending gets its row again (generation
// bumped when the row was still there), and the sweep re-dispatches it
// when its message is presumed lost.
func TestUndecidedTrackedAndTrimmed(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	_, js := connect(t, natstest.New(t))
	ctx := context.Background()
	now := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	r, err := New(pool, js, testConfig(), WithClock(clock.NewManual(now)), WithLogger(quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	ids := stage(t, pool, items("org_undecided", 0, 4)...)
	if got := undecided(t, pool); len(got) != 4 {
		t.Fatalf("after staging: %v, want the 4 items", got)
	}
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(`UPDATE outbox_items SET state = 'accepted' WHERE id = $1`, ids[0])
	exec(`UPDATE outbox_items SET state = 'leased', lease_token = 1, lease_expires_at = $2 WHERE id = $1`, ids[1], now.Add(time.Minute))
	exec(`UPDATE outbox_items SET state = 'quarantined', quarantine_reason = 'unmapped_feature' WHERE id = $1`, ids[2])
	// Moves back before any trim: the row is still there, its generation
	// is bumped.
	exec(`UPDATE outbox_items SET state = 'pending', quarantine_reason = NULL WHERE id = $1`, ids[2])
	if got := undecided(t, pool)[ids[2]]; got != 2 {
		t.Fatalf("re-entered before a trim: generation %d, want 2", got)
	}
	if _, err := r.sweep(ctx); err != nil {
		t.Fatal(err)
	}
	got := undecided(t, pool)
	if _, ok := got[ids[0]]; ok || len(got) != 3 {
		t.Fatalf("after a sweep: %v, want all but the accepted item %d", got, ids[0])
	}

	// The accepted item moves back into pending, published long ago and
	// due long ago: its row is back and the sweep re-dispatches it.
	exec(`UPDATE outbox_items SET state = 'pending', published_dispatch = dispatch,
	        published_at = $2::timestamptz - interval '1 hour', next_attempt_at = $2::timestamptz - interval '1 hour'
	      WHERE id = $1`, ids[0], now)
	if g, ok := undecided(t, pool)[ids[0]]; !ok || g != 1 {
		t.Fatalf("re-entered after a trim: %v %d, want a new row", ok, g)
	}
	n, err := r.sweep(ctx)
	if err != nil || n != 1 {
		t.Fatalf("sweep re-dispatched %d (err %v), want the re-entered item", n, err)
	}
}

// The trim never deletes the row of an item that moves back into pending
// while the trim runs: the trim reads the item as accepted, the requeue's
// transaction bumps the row's generation and holds it; once it commits, the
// trim's delete re-reads the row, finds another generation, and keeps it.
func TestTrimKeepsAnItemThatMovedBack(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	ctx := context.Background()
	ids := stage(t, pool, items("org_trim_race", 0, 1)...)
	if _, err := pool.Exec(ctx, `UPDATE outbox_items SET state = 'accepted' WHERE id = $1`, ids[0]); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `UPDATE outbox_items SET state = 'pending' WHERE id = $1`, ids[0]); err != nil {
		t.Fatal(err)
	}
	trim := make(chan error, 1)
	var trimPID int32
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&trimPID); err != nil {
		t.Fatal(err)
	}
	go func() {
		_, err := conn.Exec(ctx, trimUndecidedSQL, trimLimit)
		trim <- err
	}()
	// Wait until the trim waits for the requeue's row lock.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var blocked bool
		if err := pool.QueryRow(ctx, `SELECT cardinality(pg_blocking_pids($1)) > 0`, trimPID).Scan(&blocked); err != nil {
			t.Fatal(err)
		}
		if blocked {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the trim never waited for the requeue's lock")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-trim; err != nil {
		t.Fatal(err)
	}
	if g, ok := undecided(t, pool)[ids[0]]; !ok || g != 2 {
		t.Fatalf("after the trim: present %v, generation %d; want the row kept at generation 2", ok, g)
	}
}
