package main

import (
	"context"
	"fmt"
	"log/slog"
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

// requireMigrated refuses to start the service who when the database at url
// is not what this build was made for (migrations.Require: migrations not
// applied, or applied from other files, each named). A database that does
// not answer is not refused here: the services wait out outages.
func requireMigrated(ctx context.Context, who, url string, log *slog.Logger) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := migrations.Require(cctx, url); err != nil {
		if migrations.Refused(err) {
			return fmt.Errorf("%s: %w", who, err)
		}
		log.Warn(who+": could not check the schema; starting anyway", "err", err)
	}
	return nil
}
