package outbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// failFirst is a real pool whose first query fails with err (a Postgres
// restarting between the deliverer's two identity queries).
type failFirst struct {
	*pgxpool.Pool
	err    error
	failed bool
}

func (f *failFirst) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if !f.failed {
		f.failed = true
		return errRow{f.err}
	}
	return f.Pool.QueryRow(ctx, sql, args...)
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

func TestDatabaseID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	var db string
	if err := pool.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	id, err := outbox.DatabaseID(ctx, pool)
	if err != nil || strings.HasPrefix(id, "nosysid/") || !strings.HasSuffix(id, "/"+db+"/outbox_items") {
		t.Fatalf("superuser: %q, %v; want <system identifier>/%s/outbox_items", id, err, db)
	}

	// A connection failure is not a missing privilege: an error, not
	// "nosysid/…" (which a deliverer would take for another deployment).
	cut := errors.New("FATAL: terminating connection due to unexpected postmaster exit (SQLSTATE 57P01)")
	if got, err := outbox.DatabaseID(ctx, &failFirst{Pool: pool, err: cut}); err == nil || !errors.Is(err, cut) {
		t.Fatalf("first query cut: %q, %v; want the error", got, err)
	}

	// A role refused pg_control_system() gets the database name alone
	// (the REVOKE holds in this test's database only: pg_proc is per
	// database).
	if _, err := pool.Exec(ctx, `CREATE ROLE outbox_id_plain LOGIN`); err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `REVOKE EXECUTE ON FUNCTION pg_control_system() FROM PUBLIC`); err != nil {
		t.Fatal(err)
	}
	cfg := pool.Config().ConnConfig.Copy()
	cfg.User = "outbox_id_plain"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if id, err := outbox.DatabaseID(ctx, conn); err != nil || id != "nosysid/"+db+"/outbox_items" {
		t.Fatalf("plain role: %q, %v; want nosysid/%s/outbox_items", id, err, db)
	}
}
