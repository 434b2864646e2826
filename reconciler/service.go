package reconciler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/aurora-billing/aurora/migrations"
	"github.com/aurora-billing/aurora/shared/ops"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"
)

// providerTimeout bounds one HTTP request to Stripe.
const providerTimeout = 30 * time.Second

// Service runs provider reconciliations on a schedule.
type Service struct {
	r        *Reconciler
	metrics  *Metrics
	interval time.Duration
	log      *slog.Logger
}

// NewService returns a service running r every interval.
func NewService(r *Reconciler, metrics *Metrics, interval time.Duration, log *slog.Logger) *Service {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Service{r: r, metrics: metrics, interval: interval, log: log}
}

// RunOnce is one provider run, counted in the metrics.
func (s *Service) RunOnce(ctx context.Context) (RunReport, error) {
	start := time.Now()
	rep, err := s.r.Run(ctx)
	result := "ok"
	switch {
	case errors.Is(err, ErrProvider):
		result = "provider_error"
	case err != nil:
		result = "error"
	}
	s.metrics.observeRun(result, time.Since(start))
	return rep, err
}

// Loop runs at once and then every interval until ctx ends. A failed run
// is logged (its class, never Stripe's text) and the next one runs on
// schedule.
func (s *Service) Loop(ctx context.Context) error {
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		if _, err := s.RunOnce(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			s.log.Warn("reconciler run failed; next run on schedule", "error", err.Error(), "interval", s.interval)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Run is the `aurora reconciler` service: /healthz, /readyz (the database
// answers and the reconciliation tables exist) and /metrics on
// cfg.HTTPAddr, and a provider run every cfg.Interval (the first at
// start). With once, one run and return its error (no listener). cfg must
// pass Validate. It refuses to start (before any run) on a database not
// migrated to this build's schema or migrated from other files (an error
// wrapping migrations.ErrNotMigrated or migrations.ErrSchemaMismatch that
// names the migrations); a database that does not answer is waited out.
func Run(ctx context.Context, cfg Config, once bool, log *slog.Logger) (RunReport, error) {
	if err := cfg.Validate(); err != nil {
		return RunReport{}, err
	}
	if err := requireSchema(ctx, cfg.Database.URL, log); err != nil {
		return RunReport{}, err
	}
	pool, err := pgxpool.New(ctx, cfg.Database.URL)
	if err != nil {
		return RunReport{}, fmt.Errorf("reconciler: database: %w", err)
	}
	defer pool.Close()
	provider, err := NewStripeProvider(cfg.Stripe, cfg.RequestsPerSecond, providerTimeout)
	if err != nil {
		return RunReport{}, err
	}
	opts := cfg.Options()
	opts.Log = log
	reg := ops.NewRegistry()
	metrics := NewMetrics(reg, pool)
	svc := NewService(New(pool, provider, opts), metrics, cfg.Interval(), log)
	log.Info("reconciler starting", "config", cfg.String(), "once", once)
	if once {
		return svc.RunOnce(ctx)
	}
	mux := ops.Handler(reg, ops.Check{Name: "database", Fn: func(ctx context.Context) error {
		var ok bool
		if err := pool.QueryRow(ctx, `SELECT to_regclass('reconciliation_items') IS NOT NULL`).Scan(&ok); err != nil {
			return err
		}
		if !ok {
			return errors.New("reconciliation_items missing: run aurora migrate")
		}
		return nil
	}})
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return ops.Serve(gctx, cfg.HTTPAddr, mux) })
	g.Go(func() error { return svc.Loop(gctx) })
	if err := g.Wait(); err != nil && !errors.Is(err, context.Canceled) {
		return RunReport{}, err
	}
	return RunReport{}, nil
}

// requireSchema is the start check every aurora service makes
// (migrations.Require), bounded to 10 s.
func requireSchema(ctx context.Context, url string, log *slog.Logger) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := migrations.Require(cctx, url); err != nil {
		if migrations.Refused(err) {
			return fmt.Errorf("reconciler: %w", err)
		}
		log.Warn("reconciler: could not check the schema; starting anyway", "err", err)
	}
	return nil
}
