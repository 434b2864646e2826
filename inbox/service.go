package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/aurora-billing/aurora/migrations"

	"github.com/aurora-billing/aurora/shared/ops"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
)

// WebhookPath is where Stripe posts events.
const WebhookPath = "/webhooks/stripe"

// IngestPoolConns is the service pool's size when AURORA_DATABASE_URL sets
// no pool_max_conns: enough concurrent commits for Postgres to group their
// WAL flushes under webhook bursts.
const IngestPoolConns = 16

// NewMux returns the service's one listener: POST /webhooks/stripe plus
// ops' /healthz, /readyz and /metrics. /readyz answers 503 "not ready:
// database" when the database does not answer, and 503 naming the missing
// billing_events table and `aurora migrate` when it answers unmigrated.
func NewMux(pool *pgxpool.Pool, h *Handler, reg prometheus.Gatherer) *http.ServeMux {
	mux := ops.Handler(reg,
		ops.Check{Name: "database", Fn: func(ctx context.Context) error { return pool.Ping(ctx) }},
		ops.Check{Name: "schema: billing_events missing, migrations not applied (run aurora migrate)", Fn: func(ctx context.Context) error {
			var ok bool
			if err := pool.QueryRow(ctx, `SELECT to_regclass('billing_events') IS NOT NULL`).Scan(&ok); err != nil {
				return err
			}
			if !ok {
				return errNoInboxTable
			}
			return nil
		}})
	mux.Handle("POST "+WebhookPath, h)
	return mux
}

// Run serves the webhook endpoint and runs the worker until ctx ends.
// cfg must have passed Validate. It refuses to start on a database that is
// not migrated to this build's schema, or whose migrations came from other
// files (an error wrapping migrations.ErrNotMigrated or
// migrations.ErrSchemaMismatch, naming the migrations); a database that
// does not answer yet is waited out, not refused.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if err := requireSchema(ctx, cfg.Database.URL, log); err != nil {
		return err
	}
	pcfg, err := pgxpool.ParseConfig(cfg.Database.SessionURL())
	if err != nil {
		return fmt.Errorf("inbox: database: %w", err)
	}
	if !strings.Contains(cfg.Database.URL, "pool_max_conns") {
		pcfg.MaxConns = IngestPoolConns
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("inbox: database: %w", err)
	}
	defer pool.Close()
	reg := ops.NewRegistry()
	metrics := NewMetrics(reg, pool)
	store := NewStore(pool, nil)
	defer store.Close()
	h := NewHandler(store, cfg.Secrets(), metrics, log)
	w := NewWorker(pool, WorkerConfig{BatchSize: cfg.BatchSize, Poll: cfg.Poll(), Metrics: metrics, Log: log})
	log.Info("inbox starting", "config", cfg.String())
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return ops.Serve(gctx, cfg.Addr, NewMux(pool, h, reg)) })
	g.Go(func() error { return w.Run(gctx) })
	if err := g.Wait(); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// errNoInboxTable: the database answers but has no billing_events table.
var errNoInboxTable = errors.New("inbox: billing_events missing")

// requireSchema is the start check every aurora service makes
// (migrations.Require), bounded to 10 s.
func requireSchema(ctx context.Context, url string, log *slog.Logger) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := migrations.Require(cctx, url); err != nil {
		if migrations.Refused(err) {
			return fmt.Errorf("inbox: %w", err)
		}
		log.Warn("inbox: could not check the schema; starting anyway", "err", err)
	}
	return nil
}
