package events

import (
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
)

// InboxKeyConstraint is the constraint whose unique violation means "this
// consumer already has this event": event_inbox's primary key on
// (consumer, event_id).
const InboxKeyConstraint = "event_inbox_pkey"

// sqlStateUniqueViolation is Postgres's unique_violation.
const sqlStateUniqueViolation = "23505"

// IsDuplicateClaim reports whether err, returned by the inbox claim's
// INSERT, means the (consumer, event_id) key is taken: a unique violation
// (SQLSTATE 23505) on InboxKeyConstraint, and nothing else. A foreign-key or
// check violation, a unique violation on another constraint, a lost
// connection or a timeout is an error to retry, never a duplicate (the
// fault seed 004 fixed, where any constraint error counted; the decision is
// the SQLSTATE and the constraint name, never the error's text).
func IsDuplicateClaim(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && pg.Code == sqlStateUniqueViolation && pg.ConstraintName == InboxKeyConstraint
}
