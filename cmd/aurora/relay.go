package main

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/aurora-billing/aurora/relay"
	"github.com/aurora-billing/aurora/shared/config"
	"github.com/aurora-billing/aurora/shared/events"
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
	// Events configures the domain-event dispatcher the relay runs beside
	// the export relay: AURORA_EVENTS_DISPATCH_*, the publish timeout, the
	// stream's and retention's (shared/events.DispatcherConfig; each knob
	// has its range there and in docs/events.md). The consumers' knobs
	// (AURORA_EVENTS_CONSUMER_*, AURORA_EVENTS_CATCH_UP_LIMIT) are not the
	// relay's: a consumer process reads them.
	Events events.DispatcherConfig
	// HTTPAddr serves /healthz, /readyz and /metrics. AURORA_RELAY_HTTP_ADDR,
	// default 127.0.0.1:9101. Always on: an empty value counts as unset
	// (the default applies), like every variable.
	HTTPAddr string `env:"RELAY_HTTP_ADDR" envDefault:"127.0.0.1:9101"`
}

// Validate checks every part, naming the variable and its range.
func (c relayConfig) Validate() error {
	var addr error
	addr = config.ListenAddr("RELAY_HTTP_ADDR", c.HTTPAddr, true)
	return errors.Join(c.Database.Validate(), c.NATS.Validate(), c.Config.Validate(), c.Events.Validate(), addr)
}

// redactURL hides a URL's secrets (password, ?password=…); see config.RedactURL.
func redactURL(raw string) string { return config.RedactURL(raw) }

func newRelayCmd() *cobra.Command {
	var validate bool
	cmd := &cobra.Command{
		Use:   "relay",
		Short: "Publish committed, due outbox rows to AURORA_OUTBOX and domain events to AURORA_EVENTS",
		Long: `The relay tails outbox_items without a cursor: it claims due rows not yet published for
their dispatch with FOR UPDATE SKIP LOCKED, publishes them asynchronously with
Nats-Msg-Id = <idempotency key>.<dispatch>, and marks a row published only after its PubAck.
Rows published but still unclaimed after AURORA_RELAY_REDISPATCH_SECONDS get a new dispatch
and are published again. Any number of relays may run at once. See docs/relay.md.

Beside it runs the domain-event dispatcher: committed event_outbox rows are published to
AURORA_EVENTS (subject aurora.events.<Type>, Nats-Msg-Id = event id), woken by NOTIFY on
aurora_events with a polling fallback (AURORA_EVENTS_DISPATCH_POLL_MS); failed publishes are
retried with backoff and dead-lettered after AURORA_EVENTS_DISPATCH_MAX_ATTEMPTS; acknowledged
events older than AURORA_EVENTS_RETENTION_HOURS are purged. See docs/events.md.

Configuration: AURORA_DATABASE_URL, AURORA_NATS_URL, AURORA_OUTBOX_BATCH_SIZE,
AURORA_RELAY_POLL_MS, AURORA_RELAY_REDISPATCH_SECONDS, AURORA_RELAY_REDISPATCH_SCAN_MS,
AURORA_RELAY_MAX_INFLIGHT, AURORA_RELAY_WORKERS, AURORA_RELAY_PUBLISH_TIMEOUT_MS,
AURORA_RELAY_BATCH_MESSAGE_ITEMS (items per JetStream message; 1, the default, sends one
message per item; above 1, batch messages where a partition consumer accepts them),
AURORA_OUTBOX_STREAM_REPLICAS, AURORA_OUTBOX_DUPLICATE_WINDOW_SECONDS, AURORA_RELAY_HTTP_ADDR,
and the dispatcher's AURORA_EVENTS_DISPATCH_*, AURORA_EVENTS_PUBLISH_TIMEOUT_MS,
AURORA_EVENTS_STREAM_*, AURORA_EVENTS_DUPLICATE_WINDOW_SECONDS and AURORA_EVENTS_RETENTION_*
knobs (aurora relay --validate lists them all; the AURORA_EVENTS_CONSUMER_* knobs are a consumer's).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var cfg relayConfig
			if err := config.Load(&cfg); err != nil {
				return err
			}
			if validate {
				fmt.Fprintf(cmd.OutOrStdout(), "configuration valid: database=%s nats=%s batch_size=%d poll_ms=%d redispatch_seconds=%d redispatch_scan_ms=%d max_inflight=%d workers=%d publish_timeout_ms=%d batch_message_items=%d stream_replicas=%d duplicate_window_seconds=%d http_addr=%q events_dispatch_batch_size=%d events_dispatch_poll_ms=%d events_dispatch_max_attempts=%d\n",
					redactURL(cfg.Database.URL), redactURL(cfg.NATS.URL), cfg.Outbox.BatchSize, cfg.PollMS, cfg.RedispatchSeconds,
					cfg.RedispatchScanMS, cfg.MaxInflight, cfg.Workers, cfg.PublishTimeoutMS, cfg.BatchMessageItems, cfg.Stream.Replicas,
					cfg.Stream.DuplicateWindowSeconds, cfg.HTTPAddr, cfg.Events.DispatchBatchSize, cfg.Events.DispatchPollMS,
					cfg.Events.DispatchMaxAttempts)
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
	// one per worker, the sweep, scrapes and readiness, and two for the
	// event dispatcher (a batch and the retention purge; its LISTEN
	// connection is its own)
	pool, err := openPool(ctx, "relay", cfg.Database.SessionURL(), cfg.Workers+6)
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

	// The event dispatcher gets a JetStream context of its own: its async
	// window is one event batch, independent of the export relay's.
	ejs, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(cfg.Events.DispatchBatchSize),
		jetstream.WithPublishAsyncTimeout(time.Duration(cfg.Events.PublishTimeoutMS)*time.Millisecond))
	if err != nil {
		return fmt.Errorf("relay: jetstream (events): %w", err)
	}

	reg := ops.NewRegistry()
	r, err := relay.New(pool, js, cfg.Config, relay.WithRegistry(reg), relay.WithLogger(log))
	if err != nil {
		return err
	}
	d, err := events.NewDispatcher(pool, ejs, cfg.Events.Config(), events.WithRegistry(reg), events.WithLogger(log))
	if err != nil {
		return err
	}
	log.Info("relay: starting", "http_addr", cfg.HTTPAddr, slog.String("nats", redactURL(cfg.NATS.URL)))
	g, gctx := errgroup.WithContext(ctx)
	// /readyz: Postgres, NATS, and the domain-event dispatcher running
	// (not before the AURORA_EVENTS stream is ensured, e.g. while
	// JetStream is unreachable or disabled).
	checks := append(r.Checks(), ops.Check{Name: "events_dispatcher", Fn: d.Ready})
	g.Go(func() error { return ops.Serve(gctx, cfg.HTTPAddr, ops.Handler(reg, checks...)) })
	g.Go(func() error { return r.Run(gctx) })
	g.Go(func() error { return d.Run(gctx) })
	return g.Wait()
}
