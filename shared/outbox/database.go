package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// sqlstateInsufficientPrivilege is Postgres's insufficient_privilege.
const sqlstateInsufficientPrivilege = "42501"

// RowQuerier is what DatabaseID needs: a *pgxpool.Pool, *pgx.Conn or pgx.Tx.
type RowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// databaseIDSQL names the outbox: the cluster's system identifier (unique
// per initdb, kept by physical replicas and restores of the cluster), the
// database and the outbox table. pg_control_system() needs superuser or
// pg_monitor (or an explicit GRANT EXECUTE); without it the identifier is
// "nosysid" and the database name alone tells outboxes apart.
const databaseIDSQL = `
SELECT coalesce((SELECT system_identifier::text FROM pg_control_system()), 'nosysid') || '/' || current_database() || '/outbox_items'`

const databaseIDNoSysidSQL = `SELECT 'nosysid/' || current_database() || '/outbox_items'`

// DatabaseID returns the identity of the outbox db holds, as
// "<system identifier>/<database>/outbox_items". The relay stamps it on
// every message (HeaderDatabase) and on the stream (MetaDatabase); a
// deliverer whose own DatabaseID differs refuses to consume, so one
// deployment never works another's messages. Errors: the database's, wrapped.
//
// Only a refusal of pg_control_system() for want of privilege (SQLSTATE
// 42501) gives the "nosysid" identity; any other failure (Postgres
// restarting, a connection cut) is returned. Falling back on any error gave
// a deliverer started beside a recovering Postgres the identity
// "nosysid/…" and it refused the stream as another deployment's (the chaos
// long run).
func DatabaseID(ctx context.Context, db RowQuerier) (string, error) {
	var id string
	err := db.QueryRow(ctx, databaseIDSQL).Scan(&id)
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return id, nil
	case !errors.As(err, &pgErr) || pgErr.Code != sqlstateInsufficientPrivilege:
		return "", fmt.Errorf("outbox: database identity: %w", err)
	}
	// pg_control_system() refused (no privilege): the database name alone.
	if err := db.QueryRow(ctx, databaseIDNoSysidSQL).Scan(&id); err != nil {
		return "", fmt.Errorf("outbox: database identity: %w", err)
	}
	return id, nil
}
