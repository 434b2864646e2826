// Package migrations holds aurora's SQL schema as goose migrations embedded
// in every binary, so any service or auroractl can migrate the database it
// points at.
//
// Numbering: a new migration takes a number above every landed one, whatever
// its area, because goose refuses a lower number on a database already past
// it. Landed migrations are frozen: landed.sha256 lists each with its
// checksum, and TestLandedMigrationsAreFrozen fails when one changes, goes
// missing, or a new one is numbered below the highest landed.
//
// Triggers that name columns: outbox_items' identity trigger fires on
// updates OF its thirteen identity and payload columns, and its updated_at
// trigger's WHEN clause reads updated_at, published_dispatch, state,
// dispatch, lease_token, next_attempt_at and attempts (migration 00309).
// Postgres refuses ALTER COLUMN ... TYPE on a column a trigger definition
// names, so a migration that changes one of those types drops both
// triggers first and creates them again after.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
)

//go:embed sql/*.sql
var embedded embed.FS

// FS returns the embedded migration files (names NNNNN_name.sql).
func FS() fs.FS {
	sub, err := fs.Sub(embedded, "sql")
	if err != nil { // unreachable: the directory is embedded at build time
		panic(err)
	}
	return sub
}

// ErrMigrate wraps every failure of Up and Status.
var ErrMigrate = errors.New("migrations")

// Result is one migration applied by Up.
type Result struct {
	Version  int64  `json:"version"`
	Source   string `json:"source"`
	Duration string `json:"duration"`
}

// Status is one migration's state as reported by Status.
type Status struct {
	Version   int64  `json:"version"`
	Source    string `json:"source"`
	Applied   bool   `json:"applied"`
	AppliedAt string `json:"applied_at,omitempty"` // RFC 3339, empty when pending
}

// orderIndependent lists migrations that only add objects nothing else
// depends on, idempotently (CREATE INDEX … IF NOT EXISTS), numbered below a
// migration that landed first. A database already past them applies them
// out of order; any other missing migration still refuses to apply (goose's
// "missing (out-of-order) migration" error), because a schema built in
// another order may differ from a fresh one.
//
// 00311 drops 00040's index (DROP INDEX IF EXISTS): goose applies the
// missing migrations in version order, so a database that lacks 00040 gets
// it before 00311 and ends without the index, as a fresh one does.
var orderIndependent = map[int64]bool{
	40: true, // 00040_outbox_open_age_idx: an index for the operations gauges (dropped again by 00311)
}

func provider(databaseURL string, opts ...goose.ProviderOption) (*goose.Provider, *sql.DB, error) {
	db, err := sql.Open("pgx", databaseURL)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: open: %w", ErrMigrate, err)
	}
	opts = append([]goose.ProviderOption{goose.WithTableName("aurora_schema_migrations")}, opts...)
	p, err := goose.NewProvider(goose.DialectPostgres, db, FS(), opts...)
	if err != nil {
		db.Close()
		return nil, nil, fmt.Errorf("%w: %w", ErrMigrate, err)
	}
	return p, db, nil
}

// Up applies every pending migration to the database at databaseURL and
// returns what it applied; a second call is a no-op returning no results.
// It first refuses a database whose recorded migrations came from other
// files (Verify: *SchemaMismatchError) and afterwards records the checksum
// of every applied migration not yet recorded (aurora_schema_checksums).
// Goose takes a Postgres advisory lock so concurrent callers serialise.
// Errors wrap ErrMigrate.
func Up(ctx context.Context, databaseURL string) ([]Result, error) {
	outOfOrder, err := onlyOrderIndependentMissing(ctx, databaseURL)
	if err != nil {
		return nil, err
	}
	p, db, err := provider(databaseURL, goose.WithAllowOutofOrder(outOfOrder))
	if err != nil {
		return nil, err
	}
	defer db.Close()
	// A database whose applied migrations came from other files is not
	// migrated further: what it holds is not what the later files expect.
	if err := Verify(ctx, databaseURL); err != nil {
		return nil, err
	}
	res, err := p.Up(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: up: %w", ErrMigrate, err)
	}
	if err := recordChecksums(ctx, db); err != nil {
		return nil, err
	}
	out := make([]Result, 0, len(res))
	for _, r := range res {
		out = append(out, Result{Version: r.Source.Version, Source: r.Source.Path, Duration: r.Duration.String()})
	}
	return out, nil
}

// onlyOrderIndependentMissing reports whether the database has unapplied
// migrations below its highest applied one and every one of them is in
// orderIndependent.
func onlyOrderIndependentMissing(ctx context.Context, databaseURL string) (bool, error) {
	st, err := StatusOf(ctx, databaseURL)
	if err != nil {
		return false, err
	}
	var highest int64
	for _, m := range st {
		if m.Applied && m.Version > highest {
			highest = m.Version
		}
	}
	missing := false
	for _, m := range st {
		if !m.Applied && m.Version < highest {
			if !orderIndependent[m.Version] {
				return false, nil
			}
			missing = true
		}
	}
	return missing, nil
}

// StatusOf lists every known migration and whether it is applied. Errors wrap
// ErrMigrate.
func StatusOf(ctx context.Context, databaseURL string) ([]Status, error) {
	p, db, err := provider(databaseURL)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	st, err := p.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: status: %w", ErrMigrate, err)
	}
	out := make([]Status, 0, len(st))
	for _, s := range st {
		row := Status{Version: s.Source.Version, Source: s.Source.Path, Applied: s.State == goose.StateApplied}
		if row.Applied {
			row.AppliedAt = s.AppliedAt.UTC().Format("2006-01-02T15:04:05Z07:00")
		}
		out = append(out, row)
	}
	return out, nil
}

// keep the pgx database/sql driver registered
var _ = stdlib.GetDefaultDriver
