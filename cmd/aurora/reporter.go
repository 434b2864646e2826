package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/aurora-billing/aurora/reporter"
	"github.com/aurora-billing/aurora/shared/config"
	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/ops"
	"github.com/aurora-billing/aurora/shared/usage"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"
)

// reporterConfig is `aurora reporter`'s configuration (AURORA_* variables).
type reporterConfig struct {
	config.Database
	config.Export
	reporter.Config
	// OpsAddr serves /healthz, /readyz and /metrics. AURORA_REPORTER_OPS_ADDR,
	// defaults to empty (no listener).
	OpsAddr string `env:"REPORTER_OPS_ADDR"`
}

// Validate checks every part, naming the variable.
func (c reporterConfig) Validate() error {
	return errors.Join(c.Database.Validate(), c.Export.Validate(), c.Config.Validate(),
		config.ListenAddr("REPORTER_OPS_ADDR", c.OpsAddr, true))
}

func newReporterCmd() *cobra.Command {
	var validate, once bool
	cmd := &cobra.Command{
		Use:   "reporter",
		Short: "Run the buffered reporter: stage usage windows of the buffered era every AURORA_REPORTER_INTERVAL_SECONDS",
		Long: `The buffered reporter (seed 000): for every (tenant, feature, period) counter of the buffered
era it stages a window from the acknowledged position to the current count, subject_ref
usage:<feature>:<period start>:<from>:<to>[:r<generation>]. Periods starting at or after a
feature's cutover watermark are never staged; features whose AURORA_FEATURE_SOURCES entry is
"events" and that have no watermark are skipped.

Configuration: AURORA_DATABASE_URL, AURORA_STRIPE_ACCOUNT, AURORA_STRIPE_MODE,
AURORA_USAGE_PERIOD, AURORA_REPORTER_INTERVAL_SECONDS (1..86400, default 60),
AURORA_REPORTER_BATCH_SIZE (1..10000, default 500), AURORA_REPORTER_WORKERS (1..64, default 4),
AURORA_FEATURE_SOURCES
(feature:counters|events,…), AURORA_REPORTER_OPS_ADDR (empty = no /metrics listener).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var cfg reporterConfig
			if err := config.Load(&cfg); err != nil {
				return err
			}
			if validate {
				fmt.Fprintf(cmd.OutOrStdout(), "configuration valid: interval=%ds batch=%d workers=%d period=%s account=%s mode=%s feature_sources=%q ops_addr=%q\n",
					cfg.IntervalSeconds, cfg.BatchSize, cfg.Workers, cfg.UsagePeriod, cfg.StripeAccount, cfg.StripeMode, cfg.Sources().String(), cfg.OpsAddr)
				return nil
			}
			ctx := cmd.Context()
			if err := requireMigrated(ctx, "reporter", cfg.Database.URL, logger()); err != nil {
				return err
			}
			pool, err := pgxpool.New(ctx, cfg.Database.SessionURL())
			if err != nil {
				return fmt.Errorf("reporter: database: %w", err)
			}
			defer pool.Close()
			reg := ops.NewRegistry()
			r := &reporter.Reporter{
				Pool: pool,
				Recorder: usage.Recorder{DestinationAccount: cfg.StripeAccount, Mode: identity.Mode(cfg.StripeMode),
					Period: usage.Period(cfg.UsagePeriod)},
				Sources: cfg.Sources(), BatchSize: cfg.BatchSize, Workers: cfg.Workers, Logger: logger(), Metrics: reporter.NewMetrics(reg),
			}
			if once {
				res, err := r.Pass(ctx)
				fmt.Fprintf(cmd.OutOrStdout(), "examined=%d staged=%d advanced=%d open=%d recording=%d drift=%d failed=%d\n",
					res.Examined, res.Staged, res.Advanced, res.Open, res.Recording, res.Drift, res.Failed)
				return err
			}
			logger().Info("reporter: starting", "interval_seconds", cfg.IntervalSeconds, "period", cfg.UsagePeriod,
				"feature_sources", cfg.Sources().String())
			g, gctx := errgroup.WithContext(ctx)
			g.Go(func() error {
				return ops.Serve(gctx, cfg.OpsAddr, ops.Handler(reg, ops.Check{Name: "database", Fn: func(ctx context.Context) error { return pool.Ping(ctx) }}))
			})
			g.Go(func() error { return r.Run(gctx, cfg.Interval()) })
			return g.Wait()
		},
	}
	cmd.Flags().BoolVar(&validate, "validate", false, "check the configuration and exit")
	cmd.Flags().BoolVar(&once, "once", false, "run one pass, print its counts and exit")
	return cmd
}
