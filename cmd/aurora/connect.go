package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/aurora-billing/aurora/migrations"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
)

// openPool opens a Postgres pool of at most maxConns connections for the
// service who (used in errors).
func openPool(ctx context.Context, who, url string, maxConns int) (*pgxpool.Pool, error) {
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("%s: database: %w", who, err)
	}
	pcfg.MaxConns = int32(maxConns)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("%s: database: %w", who, err)
	}
	return pool, nil
}

// connectNATS connects the service who to NATS so that an outage is waited
// out, never fatal: unlimited reconnects, retry on a failed first connect,
// disconnects and reconnects logged.
func connectNATS(who, url string, log *slog.Logger) (*nats.Conn, error) {
	nc, err := nats.Connect(url,
		nats.Name("aurora-"+who),
		nats.MaxReconnects(-1),
		nats.RetryOnFailedConnect(true),
		nats.ReconnectWait(time.Second),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) { log.Warn(who+": NATS disconnected", "err", err) }),
		nats.ReconnectHandler(func(*nats.Conn) { log.Info(who + ": NATS reconnected") }),
	)
	if err != nil {
		return nil, fmt.Errorf("%s: nats: %w", who, err)
	}
	return nc, nil
}

// errNotMigrated: the database answers but lacks migrations this binary
// needs; the service refuses to start (exit 1) instead of failing on its
// first statement with "relation … does not exist".
var errNotMigrated = errors.New("database not migrated")

// requireMigrated refuses to start the service who when the database at url
// has migrations this binary knows but that are not applied, naming them
// and the command that applies them, or migrations applied from other files
// than this build's (migrations.SchemaMismatchError names each). A database that does not answer is
// not refused here: the services wait out outages.
func requireMigrated(ctx context.Context, who, url string, log *slog.Logger) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := migrations.StatusOf(cctx, url)
	if err != nil {
		log.Warn(who+": could not check the schema version; starting anyway", "err", err)
		return nil
	}
	var pending []string
	for _, m := range st {
		if !m.Applied {
			pending = append(pending, fmt.Sprint(m.Version))
		}
	}
	if len(pending) > 0 {
		return fmt.Errorf("%s: %w: migrations %s are not applied; run `aurora migrate` (or `auroractl migrate up`) against AURORA_DATABASE_URL",
			who, errNotMigrated, strings.Join(pending, ", "))
	}
	// Applied is not enough: each must have been applied from this build's
	// file (a database migrated at another commit can hold a migration of
	// the same number that did something else).
	if err := migrations.Verify(cctx, url); err != nil {
		if errors.Is(err, migrations.ErrSchemaMismatch) {
			return fmt.Errorf("%s: %w", who, err)
		}
		log.Warn(who+": could not verify the schema checksums; starting anyway", "err", err)
	}
	return nil
}
