package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

func sampleItem() outbox.Item {
	return outbox.Item{
		Identity: identity.Identity{
			Tenant: "org_123", SubjectKind: identity.SubjectUsageWindow,
			SubjectRef: "usage:api_calls:2026-09-01T00:00:00Z:0:5", Exporter: outbox.DefaultExporter,
			DestinationAccount: "acct_1Test", Mode: identity.ModeTest, MappingVersion: 1,
		},
		Feature: "api_calls", Quantity: 5,
		OccurredAt: time.Date(2026, 9, 1, 23, 59, 59, 0, time.UTC),
		Payload:    json.RawMessage(`{"source":"test"}`),
	}
}

func stage(t *testing.T, pool *pgxpool.Pool, it outbox.Item) (outbox.Row, error) {
	t.Helper()
	ctx := context.Background()
	var row outbox.Row
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		row, err = outbox.Stage(ctx, tx, it)
		return err
	})
	return row, err
}

func count(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox_items`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestStageWritesPendingRowWithKey(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	row, err := stage(t, pool, sampleItem())
	if err != nil {
		t.Fatal(err)
	}
	if row.State != outbox.StatePending || row.Dispatch != 1 || row.PublishedDispatch != 0 || row.LeaseToken != 0 {
		t.Fatalf("unexpected new row %+v", row)
	}
	const want = "77ccacd8c75a588c78de426666baa67e43c34992cb5ab11df4a94afe3e8601fc"
	if row.IdempotencyKey != want {
		t.Fatalf("database key %s, want %s", row.IdempotencyKey, want)
	}
	if row.Key() != row.IdempotencyKey {
		t.Fatal("Go and SQL keys differ")
	}
}

func TestStageInRolledBackTransactionLeavesNothing(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Stage(ctx, tx, sampleItem()); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool); n != 0 {
		t.Fatalf("%d rows after rollback, want 0", n)
	}
}

func TestStageSameIdentityConcurrentlyYieldsOneRow(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	const n = 20
	ids := make([]int64, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			row, err := stage(t, pool, sampleItem())
			ids[i], errs[i] = row.ID, err
		}()
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("goroutine %d: %v", i, err)
		}
		if ids[i] != ids[0] {
			t.Fatalf("goroutine %d got item %d, goroutine 0 got %d", i, ids[i], ids[0])
		}
	}
	if c := count(t, pool); c != 1 {
		t.Fatalf("%d rows, want 1", c)
	}
}

func TestRestageWithChangedPayloadIsTypedError(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	first, err := stage(t, pool, sampleItem())
	if err != nil {
		t.Fatal(err)
	}
	// Semantically equal JSON with other spacing collapses onto the row.
	same := sampleItem()
	same.Payload = json.RawMessage(`{ "source" : "test" }`)
	if row, err := stage(t, pool, same); err != nil || row.ID != first.ID {
		t.Fatalf("equal payload: row %d err %v", row.ID, err)
	}
	changes := map[string]func(*outbox.Item){
		"quantity":    func(i *outbox.Item) { i.Quantity = 6 },
		"payload":     func(i *outbox.Item) { i.Payload = json.RawMessage(`{"source":"other"}`) },
		"occurred_at": func(i *outbox.Item) { i.OccurredAt = i.OccurredAt.Add(time.Second) },
		"feature":     func(i *outbox.Item) { i.Feature = "egress_bytes" },
	}
	for name, mut := range changes {
		it := sampleItem()
		mut(&it)
		_, err := stage(t, pool, it)
		var pc *outbox.PayloadConflictError
		if !errors.Is(err, outbox.ErrPayloadConflict) || !errors.As(err, &pc) || pc.ExistingID != first.ID {
			t.Fatalf("%s: got %v, want PayloadConflictError for item %d", name, err, first.ID)
		}
	}
	if c := count(t, pool); c != 1 {
		t.Fatalf("%d rows, want 1", c)
	}
}

func TestStageRejectsInvalidInputNamingField(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	tests := map[string]func(*outbox.Item){
		"subject_kind":        func(i *outbox.Item) { i.SubjectKind = "invoice" },
		"tenant":              func(i *outbox.Item) { i.Tenant = "" },
		"subject_ref":         func(i *outbox.Item) { i.SubjectRef = "" },
		"destination_account": func(i *outbox.Item) { i.DestinationAccount = "" },
		"mode":                func(i *outbox.Item) { i.Mode = "staging" },
		"payload":             func(i *outbox.Item) { i.Payload = json.RawMessage(`[1,2]`) },
		"feature":             func(i *outbox.Item) { i.Feature = "" },
	}
	for field, mut := range tests {
		it := sampleItem()
		mut(&it)
		_, err := stage(t, pool, it)
		var fe *outbox.FieldError
		if !errors.As(err, &fe) || fe.Field != field || !errors.Is(err, outbox.ErrInvalidItem) {
			t.Fatalf("%s: got %v", field, err)
		}
	}
	if c := count(t, pool); c != 0 {
		t.Fatalf("%d rows, want 0", c)
	}
}

func TestIdentityAndPayloadAreImmutableInSQL(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	row, err := stage(t, pool, sampleItem())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, stmt := range []string{
		`UPDATE outbox_items SET payload = '{"source":"tampered"}' WHERE id = $1`,
		`UPDATE outbox_items SET quantity = 1000 WHERE id = $1`,
		`UPDATE outbox_items SET tenant = 'org_999' WHERE id = $1`,
		`UPDATE outbox_items SET subject_ref = 'x' WHERE id = $1`,
		`UPDATE outbox_items SET mapping_version = 2 WHERE id = $1`,
		`UPDATE outbox_items SET idempotency_key = 'x' WHERE id = $1`,
		`UPDATE outbox_items SET occurred_at = now() WHERE id = $1`,
		`UPDATE outbox_items SET subject_kind = 'event' WHERE id = $1`,
		`UPDATE outbox_items SET exporter = 'other' WHERE id = $1`,
		`UPDATE outbox_items SET destination_account = 'acct_other' WHERE id = $1`,
		`UPDATE outbox_items SET mode = 'live' WHERE id = $1`,
		`UPDATE outbox_items SET feature = 'egress_bytes' WHERE id = $1`,
		`UPDATE outbox_items SET period_start = now() WHERE id = $1`,
		`UPDATE outbox_items SET state = 'leased', payload = '{"source":"tampered"}' WHERE id = $1`,
	} {
		_, err := pool.Exec(ctx, stmt, row.ID)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "23000" {
			t.Fatalf("%s: got %v, want integrity_constraint_violation", stmt, err)
		}
	}
	// State columns still move, and naming an identity column with its
	// own value is not a change.
	if _, err := pool.Exec(ctx, `UPDATE outbox_items SET attempts = attempts + 1 WHERE id = $1`, row.ID); err != nil {
		t.Fatalf("state update refused: %v", err)
	}
	if _, err := pool.Exec(ctx, `UPDATE outbox_items SET tenant = tenant, payload = payload, attempts = attempts + 1 WHERE id = $1`, row.ID); err != nil {
		t.Fatalf("same-value update refused: %v", err)
	}
	// A bad state is refused by the CHECK.
	if _, err := pool.Exec(ctx, `UPDATE outbox_items SET state = 'done' WHERE id = $1`, row.ID); err == nil {
		t.Fatal("unknown state accepted")
	}
}

func TestStageQuarantinedAtStageTime(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	var row outbox.Row
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		row, err = outbox.Stage(ctx, tx, sampleItem(), outbox.WithQuarantine(outbox.ReasonPeriodBuffered))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if row.State != outbox.StateQuarantined || row.QuarantineReason == nil || *row.QuarantineReason != outbox.ReasonPeriodBuffered {
		t.Fatalf("got %s %v", row.State, row.QuarantineReason)
	}
}

// updated_at is the database's now() after every update but the relay's
// mark (published_dispatch and published_at only), which keeps it; a
// writer may set now() itself (the trigger then does not run) and any
// other value it sets is corrected (migrations 00308 and 00309).
func TestUpdatedAtRule(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	cases := []struct {
		name string
		set  string
		keep bool // updated_at keeps its value; otherwise it is the transaction's now()
	}{
		{name: "state change", set: `attempts = attempts + 1`},
		{name: "writer sets now()", set: `attempts = attempts + 1, updated_at = now()`},
		{name: "writer sets another time", set: `attempts = attempts + 1, updated_at = '2000-01-01T00:00:00Z'`},
		{name: "writer keeps the old time", set: `attempts = attempts + 1, updated_at = updated_at`},
		{name: "relay mark", set: `published_dispatch = dispatch, published_at = now()`, keep: true},
		{name: "relay mark naming updated_at", set: `published_dispatch = dispatch, published_at = now(), updated_at = '2000-01-01T00:00:00Z'`, keep: true},
		{name: "mark with a state change", set: `published_dispatch = dispatch, state = 'leased', lease_token = 1, lease_expires_at = now() + interval '1 minute'`},
		{name: "no change at all", set: `attempts = attempts`},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			it := sampleItem()
			it.SubjectRef = fmt.Sprintf("usage:api_calls:2026-09-01T00:00:00Z:0:%d", i)
			row, err := stage(t, pool, it)
			if err != nil {
				t.Fatal(err)
			}
			var before time.Time
			if err := pool.QueryRow(ctx, `SELECT updated_at FROM outbox_items WHERE id = $1`, row.ID).Scan(&before); err != nil {
				t.Fatal(err)
			}
			var after, now time.Time
			err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `UPDATE outbox_items SET `+c.set+` WHERE id = $1`, row.ID); err != nil {
					return err
				}
				return tx.QueryRow(ctx, `SELECT updated_at, now() FROM outbox_items WHERE id = $1`, row.ID).Scan(&after, &now)
			})
			if err != nil {
				t.Fatal(err)
			}
			want := now
			if c.keep {
				want = before
			}
			if !after.Equal(want) {
				t.Fatalf("updated_at = %v, want %v (before %v, now %v)", after, want, before, now)
			}
			if !c.keep && after.Equal(before) {
				t.Fatalf("updated_at did not move (%v)", after)
			}
		})
	}
}
