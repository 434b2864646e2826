package migrations_test

import (
	"context"
	"testing"

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
