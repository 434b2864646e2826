package migrations

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// ErrNotMigrated: the database lacks migrations this build has
// (NotMigratedError names them).
var ErrNotMigrated = errors.New("migrations: database not migrated")

// NotMigratedError names the migrations this build has that the database
// has not applied.
type NotMigratedError struct {
	Pending []Status
}

func (e *NotMigratedError) Error() string {
	names := make([]string, len(e.Pending))
	for i, m := range e.Pending {
		names[i] = m.Source
	}
	return fmt.Sprintf("migrations: the database is not migrated: %d migration(s) of this build are not applied (%s); run `aurora migrate` (or `auroractl migrate up`) against AURORA_DATABASE_URL",
		len(e.Pending), strings.Join(names, ", "))
}

// Unwrap returns ErrNotMigrated.
func (e *NotMigratedError) Unwrap() error { return ErrNotMigrated }

// Require is the check every service makes before it starts: the database
// at databaseURL must have every migration of this build applied
// (otherwise a *NotMigratedError, ErrNotMigrated, naming each pending
// migration file) and each applied from this build's file (otherwise a
// *SchemaMismatchError, ErrSchemaMismatch, naming each). A database that
// could not be asked returns an error wrapping ErrMigrate and neither
// sentinel: callers that wait out outages may start anyway.
func Require(ctx context.Context, databaseURL string) error {
	st, err := StatusOf(ctx, databaseURL)
	if err != nil {
		return err
	}
	var pending []Status
	for _, m := range st {
		if !m.Applied {
			pending = append(pending, m)
		}
	}
	if len(pending) > 0 {
		return &NotMigratedError{Pending: pending}
	}
	return Verify(ctx, databaseURL)
}

// Refused reports whether err from Require means the database must not be
// used by this build (not migrated, or migrated from other files), as
// opposed to a database that could not be asked.
func Refused(err error) bool {
	return errors.Is(err, ErrNotMigrated) || errors.Is(err, ErrSchemaMismatch)
}
