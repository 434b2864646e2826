package usage_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/shared/usage"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// An application role calls exactly the SQL API functions it was granted
// (migration 00307): with USAGE on schema aurora alone it may call none,
// not even the internal SECURITY DEFINER aurora.record_usage_event; granted
// aurora.record_usage it records through it, and still may not call the
// internal one.
func TestSQLAPIExecuteOnlyWhenGranted(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return usage.WriteSQLSettings(ctx, tx, sqlSettings, "test")
	}); err != nil {
		t.Fatal(err)
	}
	role := fmt.Sprintf("aurora_app_test_%d", rand.Uint64())
	exec := func(sql string) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec("CREATE ROLE " + role) // roles are cluster-wide: dropped below
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP OWNED BY "+role)
		_, _ = pool.Exec(context.Background(), "DROP ROLE "+role)
	})
	exec("GRANT USAGE ON SCHEMA aurora TO " + role)

	as := func(sql string, args ...any) error {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if _, err := tx.Exec(ctx, "SET LOCAL ROLE "+role); err != nil {
			t.Fatal(err)
		}
		_, err = tx.Exec(ctx, sql, args...)
		return err
	}
	denied := func(err error) bool {
		var pe *pgconn.PgError
		return errors.As(err, &pe) && pe.Code == "42501"
	}
	at := time.Now().UTC().Truncate(time.Second)
	record := `SELECT aurora.record_usage('tenant_g', 'evt_g', 'api_calls', 1, $1)`
	internal := `SELECT aurora.value_at_stripe('tenant_g', 'evt_g')`
	if err := as(record, at); !denied(err) {
		t.Fatalf("record_usage without a grant: %v, want permission denied", err)
	}
	if err := as(internal); !denied(err) {
		t.Fatalf("internal function without a grant: %v, want permission denied", err)
	}
	exec("GRANT EXECUTE ON FUNCTION aurora.record_usage TO " + role)
	if err := as(record, at); err != nil {
		t.Fatalf("record_usage granted: %v", err)
	}
	if err := as(internal); !denied(err) {
		t.Fatalf("internal function with only record_usage granted: %v, want permission denied", err)
	}
}
