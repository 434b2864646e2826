// Package dbtest gives every test its own freshly migrated Postgres database
// in one line:
//
//	pool := dbtest.New(t)
//
// The first call in a process migrates a template database named after a hash
// of the embedded migrations (guarded by an advisory lock, so parallel test
// binaries agree); each test then gets CREATE DATABASE … TEMPLATE, which takes
// tens of milliseconds, and the database is dropped when the test ends. Tests
// run in parallel.
//
// The server comes from AURORA_TEST_DATABASE_URL (default
// postgres://postgres@127.0.0.1:5432/test). When Postgres is unreachable the
// test fails; it never skips.
package dbtest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/migrations"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultAdminURL is used when AURORA_TEST_DATABASE_URL is unset.
const DefaultAdminURL = "postgres://postgres@127.0.0.1:5432/test"

var (
	templateOnce sync.Once
	templateName string
	templateErr  error
)

// AdminURL returns the URL of the database used to create test databases.
func AdminURL() string {
	if u := os.Getenv("AURORA_TEST_DATABASE_URL"); u != "" {
		return u
	}
	return DefaultAdminURL
}

// URLFor returns AdminURL with its database name replaced by name.
func URLFor(name string) string {
	u, err := url.Parse(AdminURL())
	if err != nil {
		return AdminURL()
	}
	u.Path = "/" + name
	return u.String()
}

func migrationsHash() (string, error) {
	h := sha256.New()
	var names []string
	err := fs.WalkDir(migrations.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			names = append(names, p)
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	sort.Strings(names)
	for _, n := range names {
		b, err := fs.ReadFile(migrations.FS(), n)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", n, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:12], nil
}

func ensureTemplate(ctx context.Context) (string, error) {
	templateOnce.Do(func() {
		templateName, templateErr = buildTemplate(ctx)
	})
	return templateName, templateErr
}

func buildTemplate(ctx context.Context) (string, error) {
	sum, err := migrationsHash()
	if err != nil {
		return "", err
	}
	name := "aurora_tmpl_" + sum
	admin, err := pgx.Connect(ctx, AdminURL())
	if err != nil {
		return "", fmt.Errorf("dbtest: connect %s (is Postgres running?): %w", redact(AdminURL()), err)
	}
	defer admin.Close(ctx)
	// Serialise template creation across parallel test binaries.
	if _, err := admin.Exec(ctx, "SELECT pg_advisory_lock(727272)"); err != nil {
		return "", err
	}
	defer admin.Exec(context.Background(), "SELECT pg_advisory_unlock(727272)") //nolint:errcheck
	var exists bool
	if err := admin.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1 AND datistemplate)", name).Scan(&exists); err != nil {
		return "", err
	}
	if exists {
		touchTemplate(ctx, admin, name)
		dropStaleTemplates(ctx, admin, name)
		return name, nil
	}
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return "", err
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", err
	}
	if _, err := migrations.Up(ctx, URLFor(name)); err != nil {
		return "", err
	}
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{name}.Sanitize()+" WITH is_template = true ALLOW_CONNECTIONS = false"); err != nil {
		return "", err
	}
	touchTemplate(ctx, admin, name)
	dropStaleTemplates(ctx, admin, name)
	return name, nil
}

// staleTemplateAge is how long a template of another migration set must go
// unused before dropStaleTemplates drops it: another checkout (a branch with
// a new migration) may be running its tests against the same server now.
const staleTemplateAge = 6 * time.Hour

// touchTemplate records when a test binary last used the template (its
// comment, Unix seconds), so dropStaleTemplates leaves templates in use
// alone.
func touchTemplate(ctx context.Context, admin *pgx.Conn, name string) {
	_, _ = admin.Exec(ctx, "COMMENT ON DATABASE "+pgx.Identifier{name}.Sanitize()+" IS '"+strconv.FormatInt(time.Now().Unix(), 10)+"'")
}

// NewDatabase creates a fresh migrated database and returns its URL; it is
// dropped when t ends. Use it when the code under test opens its own pools.
func NewDatabase(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tmpl, err := ensureTemplate(ctx)
	if err != nil {
		t.Fatalf("dbtest: template: %v", err)
	}
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	name := "aurora_t_" + hex.EncodeToString(rnd[:])
	admin, err := pgx.Connect(ctx, AdminURL())
	if err != nil {
		t.Fatalf("dbtest: connect %s (is Postgres running?): %v", redact(AdminURL()), err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+" TEMPLATE "+pgx.Identifier{tmpl}.Sanitize()); err != nil {
		t.Fatalf("dbtest: create database: %v", err)
	}
	t.Cleanup(func() { dropDatabase(t, name) })
	return URLFor(name)
}

// New creates a fresh migrated database and returns a pool on it, closed and
// dropped when t ends.
func New(t testing.TB) *pgxpool.Pool {
	t.Helper()
	dbURL := NewDatabase(t)
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatalf("dbtest: pool: %v", err)
	}
	t.Cleanup(pool.Close) // runs before the drop registered above
	return pool
}

func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "database"
	}
	return u.Redacted()
}

// NewEmptyDatabase creates an empty, unmigrated database and returns its URL;
// it is dropped when t ends. For tests of migration itself.
func NewEmptyDatabase(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	name := "aurora_e_" + hex.EncodeToString(rnd[:])
	admin, err := pgx.Connect(ctx, AdminURL())
	if err != nil {
		t.Fatalf("dbtest: connect %s (is Postgres running?): %v", redact(AdminURL()), err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("dbtest: create database: %v", err)
	}
	t.Cleanup(func() { dropDatabase(t, name) })
	return URLFor(name)
}

func dropDatabase(t testing.TB, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, AdminURL())
	if err != nil {
		t.Logf("dbtest: drop %s: %v", name, err)
		return
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		t.Logf("dbtest: drop %s: %v", name, err)
	}
}

// dropStaleTemplates drops the templates of other migration sets that no
// test binary used for staleTemplateAge (touchTemplate): dead weight on the
// server. Dropping one that another checkout's tests still clone broke
// those tests. One still being cloned refuses and is left for next time.
func dropStaleTemplates(ctx context.Context, admin *pgx.Conn, current string) {
	rows, err := admin.Query(ctx, "SELECT datname, coalesce(shobj_description(oid, 'pg_database'), '') FROM pg_database WHERE datname LIKE 'aurora\\_tmpl\\_%' AND datname <> $1", current)
	if err == nil {
		var stale []string
		for rows.Next() {
			var n, used string
			if rows.Scan(&n, &used) != nil {
				continue
			}
			if at, err := strconv.ParseInt(used, 10, 64); err == nil && time.Since(time.Unix(at, 0)) < staleTemplateAge {
				continue
			}
			stale = append(stale, n)
		}
		rows.Close()
		for _, n := range stale {
			_, _ = admin.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{n}.Sanitize()+" WITH is_template = false")
			_, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{n}.Sanitize())
		}
	}
}

// AlteredMigration is the file whose recorded checksum NewAlteredDatabase
// changes: a refusal of that database names it.
const AlteredMigration = "00017_take_bumps_dispatch.sql"

// NewAlteredDatabase creates a fresh migrated database whose recorded
// checksum of AlteredMigration differs from this build's file (as if it had
// been migrated from another copy of that migration) and returns its URL;
// it is dropped when t ends. For tests that a service refuses a database
// not of its build.
func NewAlteredDatabase(t testing.TB) string {
	t.Helper()
	url := NewDatabase(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `UPDATE aurora_schema_checksums SET sha256 = repeat('0', 64) WHERE version = 17`); err != nil {
		t.Fatalf("dbtest: alter checksum: %v", err)
	}
	return url
}
