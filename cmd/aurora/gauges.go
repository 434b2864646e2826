package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/aurora-billing/aurora/gauge"
	"github.com/aurora-billing/aurora/shared/config"
	"github.com/aurora-billing/aurora/shared/ops"
	"github.com/spf13/cobra"
)

// gaugesConfig is `aurora gauges`'s configuration (AURORA_* variables).
type gaugesConfig struct {
	config.Database
	gauge.Config
	// HTTPAddr serves /healthz, /readyz and /metrics.
	// AURORA_GAUGES_HTTP_ADDR, default 127.0.0.1:9104.
	HTTPAddr string `env:"GAUGES_HTTP_ADDR" envDefault:"127.0.0.1:9104"`
}

// Validate checks every part, naming the variable and its range.
func (c gaugesConfig) Validate() error {
	return errors.Join(c.Database.Validate(), c.Config.Validate(), config.ListenAddr("GAUGES_HTTP_ADDR", c.HTTPAddr, false))
}

func newGaugesCmd() *cobra.Command {
	var validate bool
	cmd := &cobra.Command{
		Use:   "gauges",
		Short: "Export the database-derived gauges operators watch (run exactly one)",
		Long: `gauges measures, at each scrape of /metrics, what the alert rules watch: the outbox's
backlog age by state, uncertain items (count, oldest), quarantined items by reason, and the
webhook inbox's pending events, dead letters by reason, highest attempt count and oldest
pending age. A query that fails makes the scrape fail (HTTP 500, up == 0), never a zero.

Run one replica: the figures are the database's, not a replica's. It writes nothing.

Configuration: AURORA_DATABASE_URL, AURORA_GAUGES_HTTP_ADDR (default 127.0.0.1:9104),
AURORA_GAUGES_QUERY_TIMEOUT_MS (100..60000, default 5000), AURORA_GAUGES_COUNT_CAP
(100..10000000, default 100000), AURORA_GAUGES_MIN_INTERVAL_MS (0..60000, default 5000).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var cfg gaugesConfig
			if err := config.Load(&cfg); err != nil {
				return err
			}
			if validate {
				fmt.Fprintf(cmd.OutOrStdout(), "configuration valid: database=%s query_timeout_ms=%d count_cap=%d min_interval_ms=%d http_addr=%q\n",
					redactURL(cfg.Database.URL), cfg.QueryTimeoutMS, cfg.CountCap, cfg.MinIntervalMS, cfg.HTTPAddr)
				return nil
			}
			return runGauges(cmd.Context(), cfg)
		},
	}
	cmd.Flags().BoolVar(&validate, "validate", false, "check the configuration and exit")
	return cmd
}

func runGauges(ctx context.Context, cfg gaugesConfig) error {
	log := logger()
	if err := requireMigrated(ctx, "gauges", cfg.Database.URL, log); err != nil {
		return err
	}
	pool, err := openPool(ctx, "gauges", cfg.Database.SessionURL(), 2) // one measurement at a time, plus readiness
	if err != nil {
		return err
	}
	defer pool.Close()
	r, err := gauge.NewReader(pool, cfg.Config)
	if err != nil {
		return err
	}
	reg := ops.NewRegistry()
	reg.MustRegister(gauge.NewCollector(r, log))
	log.Info("gauges: starting", "http_addr", cfg.HTTPAddr)
	return ops.Serve(ctx, cfg.HTTPAddr, ops.Handler(reg, ops.Check{Name: "postgres", Fn: pool.Ping}))
}
