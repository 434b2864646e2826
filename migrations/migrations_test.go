package migrations_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/aurora-billing/aurora/migrations"
	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/jackc/pgx/v5"
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

// TestMigrationsFrozen: every migration file is listed in checksums.txt with
// its SHA-256, and every listed file is still there unchanged. A landed
// migration is never edited or renamed: add a new one and append its line.
func TestMigrationsFrozen(t *testing.T) {
	t.Parallel()
	files, err := migrations.Files()
	if err != nil {
		t.Fatal(err)
	}
	frozen, err := migrations.Frozen()
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, f := range files {
		have[f.Name] = true
		want, ok := frozen[f.Name]
		switch {
		case !ok:
			t.Errorf("%s is not in migrations/checksums.txt: append \"%s %s\"", f.Name, f.Name, f.SHA256)
		case want != f.SHA256:
			t.Errorf("%s changed (sha256 %s, frozen as %s): landed migrations are frozen; restore it and add a new migration", f.Name, f.SHA256, want)
		}
	}
	for name := range frozen {
		if !have[name] {
			t.Errorf("%s is listed in checksums.txt but gone: landed migrations are never removed or renamed", name)
		}
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
