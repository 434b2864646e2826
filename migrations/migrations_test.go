package migrations_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/aurora-billing/aurora/migrations"
	"github.com/aurora-billing/aurora/migrations/dbtest"
)

func TestUpTwiceIsNoOp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.NewDatabase(t) // already migrated from the template
	res, err := migrations.Up(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 0 {
		t.Fatalf("second up applied %d migrations, want 0", len(res))
	}
	st, err := migrations.StatusOf(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	if len(st) == 0 {
		t.Fatal("no migrations known")
	}
	for _, s := range st {
		if !s.Applied {
			t.Errorf("migration %d not applied", s.Version)
		}
	}
}

func TestUpOnEmptyDatabaseThenNoOp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.NewEmptyDatabase(t)
	first, err := migrations.Up(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	if len(first) == 0 {
		t.Fatal("first up applied nothing")
	}
	second, err := migrations.Up(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	if len(second) != 0 {
		t.Fatalf("second up applied %d migrations, want 0", len(second))
	}
}

// A database migrated before an order-independent migration landed (its
// number below the database's highest) gets it applied, in version order
// with the migrations it also lacks: 00040's index, dropped again by 00311,
// is absent at the end, as in a fresh database. Any other missing migration
// is still refused.
func TestUpAppliesOrderIndependentMigrationsOutOfOrderOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.NewEmptyDatabase(t)
	if err := migrations.UpTo(ctx, url, 100); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `DELETE FROM aurora_schema_migrations WHERE version_id = 40;
		DROP INDEX outbox_items_open_created_idx`); err != nil {
		t.Fatal(err)
	}
	res, err := migrations.Up(ctx, url)
	if err != nil {
		t.Fatalf("up with 00040 missing below the highest: %v", err)
	}
	if len(res) < 2 || res[0].Version != 40 || res[len(res)-1].Version < 311 {
		t.Fatalf("applied %+v, want 40 first and every later one through 311", res)
	}
	var idx *string
	if err := conn.QueryRow(ctx, `SELECT to_regclass('outbox_items_open_created_idx')::text`).Scan(&idx); err != nil || idx != nil {
		t.Fatalf("00040's index after 00311: %v %v, want none", idx, err)
	}
	if err := migrations.Verify(ctx, url); err != nil {
		t.Fatal(err)
	}

	if _, err := conn.Exec(ctx, `DELETE FROM aurora_schema_migrations WHERE version_id = 17`); err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.Up(ctx, url); !errors.Is(err, migrations.ErrMigrate) || !strings.Contains(err.Error(), "out-of-order") {
		t.Fatalf("up with 00017 missing: %v, want the out-of-order refusal", err)
	}
}

// TestVerifyRefusesAnotherFile: a database whose recorded checksum of a
// migration differs from this build's file (migrated at another commit) is
// refused by Verify and by Up, naming the migration; Up records every
// applied migration's checksum.
func TestVerifyRefusesAnotherFile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.NewEmptyDatabase(t)
	if _, err := migrations.Up(ctx, url); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Verify(ctx, url); err != nil {
		t.Fatalf("fresh database: %v", err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	files, _ := migrations.Files()
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM aurora_schema_checksums`).Scan(&n); err != nil || n != len(files) {
		t.Fatalf("recorded %d checksums (err %v), want %d", n, err, len(files))
	}
	if _, err := conn.Exec(ctx, `UPDATE aurora_schema_checksums SET sha256 = repeat('0', 64) WHERE version = 17`); err != nil {
		t.Fatal(err)
	}
	err = migrations.Verify(ctx, url)
	var mm *migrations.SchemaMismatchError
	if !errors.Is(err, migrations.ErrSchemaMismatch) || !errors.As(err, &mm) || len(mm.Mismatches) != 1 ||
		!strings.Contains(err.Error(), "00017_take_bumps_dispatch.sql") {
		t.Fatalf("Verify: %v, want a mismatch naming 00017_take_bumps_dispatch.sql", err)
	}
	if _, err := migrations.Up(ctx, url); !errors.Is(err, migrations.ErrSchemaMismatch) {
		t.Fatalf("Up on a mismatched database: %v, want ErrSchemaMismatch", err)
	}
}

// TestRequire: the check every service makes before it starts refuses a
// database with no migrations (naming a pending file) and one whose
// recorded checksum differs (naming the migration), and passes a freshly
// migrated one; a database that cannot be asked is neither refusal.
func TestRequire(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.NewEmptyDatabase(t)
	err := migrations.Require(ctx, url)
	var nm *migrations.NotMigratedError
	if !errors.Is(err, migrations.ErrNotMigrated) || !errors.As(err, &nm) || !migrations.Refused(err) ||
		!strings.Contains(err.Error(), "00001_") || !strings.Contains(err.Error(), "aurora migrate") {
		t.Fatalf("empty database: %v, want ErrNotMigrated naming 00001_… and `aurora migrate`", err)
	}
	if _, err := migrations.Up(ctx, url); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Require(ctx, url); err != nil {
		t.Fatalf("migrated database: %v", err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `UPDATE aurora_schema_checksums SET sha256 = repeat('0', 64) WHERE version = 17`); err != nil {
		t.Fatal(err)
	}
	err = migrations.Require(ctx, url)
	if !errors.Is(err, migrations.ErrSchemaMismatch) || !migrations.Refused(err) ||
		!strings.Contains(err.Error(), "00017_take_bumps_dispatch.sql") {
		t.Fatalf("altered checksum: %v, want ErrSchemaMismatch naming 00017_take_bumps_dispatch.sql", err)
	}
	err = migrations.Require(ctx, "postgres://postgres@127.0.0.1:1/nowhere?connect_timeout=1")
	if err == nil || migrations.Refused(err) || !errors.Is(err, migrations.ErrMigrate) {
		t.Fatalf("unreachable database: %v, want ErrMigrate and no refusal", err)
	}
}
