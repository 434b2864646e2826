package main

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/aurora-billing/aurora/relay"
	"github.com/aurora-billing/aurora/shared/config"
	"github.com/aurora-billing/aurora/shared/ops"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"
)

// relayConfig is `aurora relay`'s configuration (AURORA_* variables).
type relayConfig struct {
	config.Database
	config.NATS
	relay.Config
	// HTTPAddr serves /healthz, /readyz and /metrics. AURORA_RELAY_HTTP_ADDR,
	// default 127.0.0.1:9101; empty disables the listener.
	HTTPAddr string `env:"RELAY_HTTP_ADDR" envDefault:"127.0.0.1:9101"`
}

// Validate checks every part, naming the variable and its range.
func (c relayConfig) Validate() error {
	var addr error
	addr = config.ListenAddr("RELAY_HTTP_ADDR", c.HTTPAddr, true)
	return errors.Join(c.Database.Validate(), c.NATS.Validate(), c.Config.Validate(), addr)
}

// redactURL hides a URL's secrets (password, ?password=…); see config.RedactURL.
func redactURL(raw string) string { return config.RedactURL(raw) }

func newRelayCmd() *cobra.Command {
	var validate bool
	cmd := &cobra.Command{
		Use:   "relay",
		Short: "Publish committed, due outbox rows to the AURORA_OUTBOX JetStream stream",
		Long: `The relay tails outbox_items without a cursor: it claims due rows not yet published for
their dispatch with FOR UPDATE SKIP LOCKED, publishes them asynchronously with
Nats-Msg-Id = <idempotency key>.<dispatch>, and marks a row published only after its PubAck.
Rows published but still unclaimed after AURORA_RELAY_REDISPATCH_SECONDS get a new dispatch
and are published again. Any number of relays may run at once. See docs/relay.md.

Configuration: AURORA_DATABASE_URL, AURORA_NATS_URL, AURORA_OUTBOX_BATCH_SIZE,
AURORA_RELAY_POLL_MS, AURORA_RELAY_REDISPATCH_SECONDS, AURORA_RELAY_REDISPATCH_SCAN_MS,
AURORA_RELAY_MAX_INFLIGHT, AURORA_RELAY_WORKERS, AURORA_RELAY_PUBLISH_TIMEOUT_MS,
AURORA_OUTBOX_STREAM_REPLICAS, AURORA_OUTBOX_DUPLICATE_WINDOW_SECONDS, AURORA_RELAY_HTTP_ADDR.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var cfg relayConfig
			if err := config.Load(&cfg); err != nil {
				return err
			}
			if validate {
				fmt.Fprintf(cmd.OutOrStdout(), "configuration valid: database=%s nats=%s batch_size=%d poll_ms=%d redispatch_seconds=%d redispatch_scan_ms=%d max_inflight=%d workers=%d publish_timeout_ms=%d stream_replicas=%d duplicate_window_seconds=%d http_addr=%q\n",
					redactURL(cfg.Database.URL), redactURL(cfg.NATS.URL), cfg.Outbox.BatchSize, cfg.PollMS, cfg.RedispatchSeconds,
					cfg.RedispatchScanMS, cfg.MaxInflight, cfg.Workers, cfg.PublishTimeoutMS, cfg.Stream.Replicas,
					cfg.Stream.DuplicateWindowSeconds, cfg.HTTPAddr)
				return nil
			}
			return runRelay(cmd, cfg)
		},
	}
	cmd.Flags().BoolVar(&validate, "validate", false, "check the configuration and exit")
	return cmd
}

func runRelay(cmd *cobra.Command, cfg relayConfig) error {
	ctx := cmd.Context()
	log := logger()
	if err := requireMigrated(ctx, "relay", cfg.Database.URL, log); err != nil {
		return err
	}
	pool, err := openPool(ctx, "relay", cfg.Database.SessionURL(), cfg.Workers+4) // one per worker, the sweep, scrapes and readiness
	if err != nil {
		return err
	}
	defer pool.Close()
	nc, err := connectNATS("relay", cfg.NATS.URL, log)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(cfg.MaxInflight),
		jetstream.WithPublishAsyncTimeout(time.Duration(cfg.PublishTimeoutMS)*time.Millisecond))
	if err != nil {
		return fmt.Errorf("relay: jetstream: %w", err)
	}

	reg := ops.NewRegistry()
	r, err := relay.New(pool, js, cfg.Config, relay.WithRegistry(reg), relay.WithLogger(log))
	if err != nil {
		return err
	}
	log.Info("relay: starting", "http_addr", cfg.HTTPAddr, slog.String("nats", redactURL(cfg.NATS.URL)))
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return ops.Serve(gctx, cfg.HTTPAddr, ops.Handler(reg, r.Checks()...)) })
	g.Go(func() error { return r.Run(gctx) })
	return g.Wait()
}
