package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"

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
// ops' /healthz, /readyz (the database answers and the inbox table exists)
// and /metrics.
func NewMux(pool *pgxpool.Pool, h *Handler, reg prometheus.Gatherer) *http.ServeMux {
	mux := ops.Handler(reg, ops.Check{Name: "database", Fn: func(ctx context.Context) error {
		var ok bool
		return pool.QueryRow(ctx, `SELECT to_regclass('billing_events') IS NOT NULL`).Scan(&ok)
	}})
	mux.Handle("POST "+WebhookPath, h)
	return mux
}

// Run serves the webhook endpoint and runs the worker until ctx ends.
// cfg must have passed Validate.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	if err := cfg.Validate(); err != nil {
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
