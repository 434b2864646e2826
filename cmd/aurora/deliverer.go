package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aurora-billing/aurora/deliverer"
	"github.com/aurora-billing/aurora/deliverer/streamexport"
	"github.com/aurora-billing/aurora/deliverer/stripeexport"
	"github.com/aurora-billing/aurora/shared/config"
	"github.com/aurora-billing/aurora/shared/ops"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"
)

// delivererConfig is `aurora deliverer`'s configuration (AURORA_* variables).
type delivererConfig struct {
	config.Database
	config.NATS
	deliverer.Config
	Stripe stripeexport.Config
	// StreamBase: the v2 meter event stream host for accounts provisioned
	// --exporter stream. AURORA_STRIPE_STREAM_BASE, default "": Stripe's
	// https://meter-events.stripe.com, or AURORA_STRIPE_API_BASE when that
	// is not Stripe's (the emulator serves both).
	StreamBase string `env:"STRIPE_STREAM_BASE"`
	// DBConns: Postgres connections of the pool (each item needs two short
	// statements; calls hold none). AURORA_DELIVERER_DB_CONNS, default 16,
	// 2..256.
	DBConns int `env:"DELIVERER_DB_CONNS" envDefault:"16"`
	// HTTPAddr serves /healthz, /readyz and /metrics.
	// AURORA_DELIVERER_HTTP_ADDR, default 127.0.0.1:9102. Always on: an empty
	// value counts as unset (the default applies), like every variable.
	HTTPAddr string `env:"DELIVERER_HTTP_ADDR" envDefault:"127.0.0.1:9102"`
}

// Validate checks every part, naming the variable and its range.
func (c *delivererConfig) Validate() error {
	var addr error
	addr = config.ListenAddr("DELIVERER_HTTP_ADDR", c.HTTPAddr, true)
	var stream error
	if c.StreamBase != "" {
		stream = config.URL("STRIPE_STREAM_BASE", c.StreamBase, "http", "https")
	}
	return errors.Join(c.Database.Validate(), c.NATS.Validate(), c.Config.Validate(), c.Stripe.Validate(), stream,
		config.IntRange("DELIVERER_DB_CONNS", c.DBConns, 2, 256, "connections"), addr)
}

func newDelivererCmd() *cobra.Command {
	var validate bool
	cmd := &cobra.Command{
		Use:   "deliverer",
		Short: "Claim outbox items from AURORA_OUTBOX, send them to Stripe meter events, record outcomes",
		Long: `The deliverer is stateless: run any number of replicas of a pool. AURORA_OUTBOX is split into
partitions by lane (account, customer, meter); JetStream pins each partition consumer to one
replica at a time (a priority group, pinned client), and a standby takes over within
AURORA_DELIVERER_PINNED_TTL_SECONDS when the owner dies. For each message the owner claims the row
in Postgres (FOR UPDATE SKIP LOCKED, lease_token+1), runs the pre-send checks, sends the meter
event with identifier = Idempotency-Key = the item's key, classifies Stripe's answer with one
table and records the outcome fenced by lease_token. A lane's calls run one at a time.
It refuses to start on another deployment's stream, on a consumer another replica consumes with
other filters, and on a database whose schema does not match this build. See docs/deliverer.md.

Configuration: AURORA_DATABASE_URL, AURORA_NATS_URL, AURORA_STRIPE_API_KEY (never printed),
AURORA_STRIPE_API_BASE, AURORA_STRIPE_STREAM_BASE, AURORA_STRIPE_TIMEOUT_SECONDS, AURORA_OUTBOX_LEASE_SECONDS,
AURORA_OUTBOX_MAX_ATTEMPTS, AURORA_OUTBOX_BACKOFF_BASE_SECONDS, AURORA_OUTBOX_BACKOFF_CAP_SECONDS,
AURORA_UNCERTAINTY_HORIZON_SECONDS, AURORA_DELIVERER_CONCURRENCY, AURORA_DELIVERER_CONSUMER,
AURORA_DELIVERER_FILTER_SUBJECT, AURORA_DELIVERER_ACK_WAIT_SECONDS, AURORA_DELIVERER_BUSY_DELAY_MS,
AURORA_DELIVERER_SHUTDOWN_SECONDS, AURORA_DELIVERER_PINNED_TTL_SECONDS, AURORA_DELIVERER_DB_CONNS,
AURORA_DELIVERER_STREAM_LINGER_MS, AURORA_DELIVERER_BATCH_LINGER_MS, AURORA_DELIVERER_HTTP_ADDR.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var cfg delivererConfig
			if err := config.Load(&cfg); err != nil {
				return err
			}
			if validate {
				fmt.Fprintf(cmd.OutOrStdout(), "configuration valid: database=%s nats=%s stripe_api_base=%s stripe_key_mode=%s stripe_timeout_seconds=%d lease_seconds=%d max_attempts=%d backoff_base_seconds=%d backoff_cap_seconds=%d horizon_seconds=%d concurrency=%d consumer=%s filter_subject=%s ack_wait_seconds=%d busy_delay_ms=%d shutdown_seconds=%d pinned_ttl_seconds=%d stream_linger_ms=%d batch_linger_ms=%d db_conns=%d http_addr=%q\n",
					redactURL(cfg.Database.URL), redactURL(cfg.NATS.URL), redactURL(cfg.Stripe.APIBase), stripeexport.KeyMode(cfg.Stripe.APIKey),
					cfg.ProviderTimeoutSeconds, cfg.LeaseSeconds, cfg.MaxAttempts, cfg.BackoffBaseSeconds, cfg.BackoffCapSeconds,
					cfg.UncertaintyHorizonSeconds, cfg.Concurrency, cfg.Consumer, cfg.FilterSubject, cfg.AckWaitSeconds,
					cfg.BusyDelayMillis, cfg.ShutdownSeconds, cfg.PinnedTTLSeconds, cfg.StreamLingerMillis, cfg.BatchLingerMillis, cfg.DBConns, cfg.HTTPAddr)
				return nil
			}
			return runDeliverer(cmd.Context(), cfg)
		},
	}
	cmd.Flags().BoolVar(&validate, "validate", false, "check the configuration and exit")
	return cmd
}

func runDeliverer(ctx context.Context, cfg delivererConfig) error {
	log := logger()
	if err := requireMigrated(ctx, "deliverer", cfg.Database.URL, log); err != nil {
		return err
	}
	pool, err := openPool(ctx, "deliverer", cfg.Database.SessionURL(), cfg.DBConns)
	if err != nil {
		return err
	}
	defer pool.Close()
	nc, err := connectNATS("deliverer", cfg.NATS.URL, log)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("deliverer: jetstream: %w", err)
	}
	v1, err := stripeexport.New(cfg.Stripe, time.Duration(cfg.ProviderTimeoutSeconds)*time.Second, cfg.Concurrency)
	if err != nil {
		return err
	}
	reg := ops.NewRegistry()
	// Accounts provisioned --exporter stream are sent through the v2 meter
	// event stream; its sessions (one per account) are made lazily.
	stream, err := streamexport.New(streamexport.Config{Client: streamexport.ClientConfig{APIKey: cfg.Stripe.APIKey,
		APIBase: cfg.Stripe.APIBase, StreamBase: cfg.StreamBase, Timeout: time.Duration(cfg.ProviderTimeoutSeconds) * time.Second,
		MaxConns: cfg.Concurrency, Registerer: reg}, Linger: cfg.StreamLinger()})
	if err != nil {
		return err
	}
	defer stream.Close()
	exp := streamexport.Router{V1: v1, Stream: stream}
	d, err := deliverer.New(pool, js, exp, cfg.Config, deliverer.WithRegisterer(reg), deliverer.WithLogger(log))
	if err != nil {
		return err
	}
	checks := []ops.Check{
		{Name: "postgres", Fn: func(ctx context.Context) error { return pool.Ping(ctx) }},
		{Name: "nats", Fn: func(context.Context) error {
			if !nc.IsConnected() {
				return errors.New("not connected")
			}
			return nil
		}},
	}
	checks = append(checks, d.Checks()...)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return ops.Serve(gctx, cfg.HTTPAddr, ops.Handler(reg, checks...)) })
	g.Go(func() error { return d.Run(gctx) })
	return g.Wait()
}
