package outbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

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
func DatabaseID(ctx context.Context, db RowQuerier) (string, error) {
	var id string
	if err := db.QueryRow(ctx, databaseIDSQL).Scan(&id); err == nil {
		return id, nil
	}
	// pg_control_system() refused (no privilege): the database name alone.
	if err := db.QueryRow(ctx, databaseIDNoSysidSQL).Scan(&id); err != nil {
		return "", fmt.Errorf("outbox: database identity: %w", err)
	}
	return id, nil
}
