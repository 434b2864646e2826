package migrations

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
)

// ErrSchemaMismatch: the database's migrations were applied from other files
// than this build's (SchemaMismatchError names them).
var ErrSchemaMismatch = errors.New("migrations: schema does not match this build")

// File is one embedded migration: its version, file name and the SHA-256 of
// its contents (lowercase hex).
type File struct {
	Version int64
	Name    string
	SHA256  string
}

// Files lists the embedded migrations in version order. Errors wrap
// ErrMigrate (a file name without a numeric version prefix).
func Files() ([]File, error) {
	var out []File
	err := fs.WalkDir(FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".sql") {
			return err
		}
		b, err := fs.ReadFile(FS(), p)
		if err != nil {
			return err
		}
		num, _, ok := strings.Cut(p, "_")
		v, perr := strconv.ParseInt(num, 10, 64)
		if !ok || perr != nil {
			return fmt.Errorf("%w: migration file %s has no version prefix", ErrMigrate, p)
		}
		sum := sha256.Sum256(b)
		out = append(out, File{Version: v, Name: p, SHA256: hex.EncodeToString(sum[:])})
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// SchemaMismatchError names every migration whose file, as recorded in the
// database when it was applied, differs from this build's.
type SchemaMismatchError struct {
	Mismatches []Mismatch
}

// Mismatch is one migration applied from another file than this build's.
type Mismatch struct {
	Version  int64
	File     string // this build's file
	Applied  string // the file name recorded in the database
	Database string // the recorded SHA-256
	Build    string // this build's SHA-256
}

func (e *SchemaMismatchError) Error() string {
	parts := make([]string, len(e.Mismatches))
	for i, m := range e.Mismatches {
		parts[i] = fmt.Sprintf("migration %s was applied from another file (%s, sha256 %.12s…; this build's is %.12s…)",
			m.File, m.Applied, m.Database, m.Build)
	}
	return "migrations: the database schema does not match this build: " + strings.Join(parts, "; ") +
		"; run the build whose migrations this database has, or restore the database"
}

// Unwrap returns ErrSchemaMismatch.
func (e *SchemaMismatchError) Unwrap() error { return ErrSchemaMismatch }

// recordChecksumsSQL records the checksum of an applied migration unless one
// is recorded (the first record of a version is the file it was applied
// from, or the first binary's after 00302 for older ones).
const recordChecksumsSQL = `
INSERT INTO aurora_schema_checksums (version, file, sha256)
SELECT v, f, s FROM unnest($1::bigint[], $2::text[], $3::text[]) AS t(v, f, s)
WHERE v IN (SELECT version_id FROM aurora_schema_migrations WHERE is_applied)
ON CONFLICT (version) DO NOTHING`

const checksumsTableSQL = `SELECT to_regclass('aurora_schema_checksums') IS NOT NULL`

const recordedChecksumsSQL = `SELECT version, file, sha256 FROM aurora_schema_checksums ORDER BY version`

// recordChecksums records this build's checksum of every applied migration
// that has none recorded yet (a no-op before migration 00302).
func recordChecksums(ctx context.Context, db *sql.DB) error {
	var has bool
	if err := db.QueryRowContext(ctx, checksumsTableSQL).Scan(&has); err != nil {
		return fmt.Errorf("%w: checksums: %w", ErrMigrate, err)
	}
	if !has {
		return nil
	}
	files, err := Files()
	if err != nil {
		return err
	}
	vs, names, sums := make([]int64, len(files)), make([]string, len(files)), make([]string, len(files))
	for i, f := range files {
		vs[i], names[i], sums[i] = f.Version, f.Name, f.SHA256
	}
	if _, err := db.ExecContext(ctx, recordChecksumsSQL, vs, names, sums); err != nil {
		return fmt.Errorf("%w: record checksums: %w", ErrMigrate, err)
	}
	return nil
}

// Verify checks that every migration the database at databaseURL recorded
// (aurora_schema_checksums) was applied from the same file as this build's.
// It returns a *SchemaMismatchError (ErrSchemaMismatch) naming each
// migration that differs, nil when all match or nothing is recorded (a
// database older than migration 00302), and other errors wrapping ErrMigrate.
// Versions the build does not know are not judged here (StatusOf lists what
// the build knows).
func Verify(ctx context.Context, databaseURL string) error {
	db, err := sql.Open("pgx", databaseURL)
	if err != nil {
		return fmt.Errorf("%w: open: %w", ErrMigrate, err)
	}
	defer db.Close()
	var has bool
	if err := db.QueryRowContext(ctx, checksumsTableSQL).Scan(&has); err != nil {
		return fmt.Errorf("%w: checksums: %w", ErrMigrate, err)
	}
	if !has {
		return nil
	}
	files, err := Files()
	if err != nil {
		return err
	}
	byVersion := make(map[int64]File, len(files))
	for _, f := range files {
		byVersion[f.Version] = f
	}
	rows, err := db.QueryContext(ctx, recordedChecksumsSQL)
	if err != nil {
		return fmt.Errorf("%w: checksums: %w", ErrMigrate, err)
	}
	defer rows.Close()
	var bad []Mismatch
	for rows.Next() {
		var v int64
		var file, sum string
		if err := rows.Scan(&v, &file, &sum); err != nil {
			return fmt.Errorf("%w: checksums: %w", ErrMigrate, err)
		}
		f, ok := byVersion[v]
		if ok && f.SHA256 != sum {
			bad = append(bad, Mismatch{Version: v, File: f.Name, Applied: file, Database: sum, Build: f.SHA256})
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("%w: checksums: %w", ErrMigrate, err)
	}
	if len(bad) > 0 {
		return &SchemaMismatchError{Mismatches: bad}
	}
	return nil
}
