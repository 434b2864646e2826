// Command ledger is a runnable example consumer of aurora's domain events:
// it consumes InvoicePaid.v1 (published by the webhook inbox, dispatched by
// `aurora relay`) and posts each paid invoice as a double entry, debit 1010
// / credit 2010 by default (seed 004's chart of accounts), exactly once per
// event however often it is delivered.
//
//	go run ./examples/ledger [--debit 1010] [--credit 2010] [--consumer ledger]
//
// Configuration: AURORA_DATABASE_URL (the events database, where the ledger
// creates its tables), AURORA_NATS_URL, and the consumer knobs of
// docs/events.md (AURORA_EVENTS_CONSUMER_INTERVAL_MS, …_CATCH_UP_LIMIT,
// …_CONSUMER_MAX_ATTEMPTS, …). SIGINT/SIGTERM stop it; a kill -9
// mid-handler rolls the posting back with its inbox claim.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/aurora-billing/aurora/inbox"
	"github.com/aurora-billing/aurora/shared/config"
	"github.com/aurora-billing/aurora/shared/events"
	"github.com/aurora-billing/aurora/shared/ops"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/sethvargo/go-retry"
)

// Config is the example's environment (AURORA_*).
type Config struct {
	config.Database
	config.NATS
	Events events.Config
}

// Validate checks every part.
func (c Config) Validate() error {
	return errors.Join(c.Database.Validate(), c.NATS.Validate(), c.Events.Validate())
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stderr))
}

// run parses args, loads the configuration and consumes until ctx ends. It
// returns the exit code: 0 after a graceful stop, 2 for bad flags or
// configuration, 1 for a failure.
func run(ctx context.Context, args []string, stderr io.Writer) int {
	log := ops.NewLogger(stderr, slog.LevelInfo)
	fs := flag.NewFlagSet("ledger", flag.ContinueOnError)
	fs.SetOutput(stderr)
	chart := DefaultChart()
	fs.StringVar(&chart.Debit, "debit", chart.Debit, "account debited by a paid invoice's amount")
	fs.StringVar(&chart.Credit, "credit", chart.Credit, "account credited by a paid invoice's amount")
	consumer := fs.String("consumer", "ledger", "the events consumer name (its inbox rows and durable JetStream consumer)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	l, err := New(chart)
	if err != nil {
		fmt.Fprintln(stderr, "ledger:", err)
		return 2
	}
	if err := events.ValidateConsumer(*consumer, []string{inbox.EventInvoicePaid}); err != nil {
		fmt.Fprintln(stderr, "ledger:", err)
		return 2
	}
	log.Info("ledger: chart of accounts", "debit", chart.Debit, "credit", chart.Credit)
	var cfg Config
	if err := config.Load(&cfg); err != nil {
		fmt.Fprintln(stderr, "ledger:", err)
		return 2
	}
	if err := consume(ctx, cfg, *consumer, l.Handle, log); err != nil {
		fmt.Fprintln(stderr, "ledger:", err)
		return 1
	}
	return 0
}

// waitSchema creates the ledger's tables (EnsureSchema), waiting out a
// database that is not reachable yet (a start beside a restarting Postgres:
// the chaos harness saw the example exit 63 times for it): a connection
// failure is retried with a growing pause (100 ms doubling to 5 s) until ctx
// ends; any other error is returned.
func waitSchema(ctx context.Context, pool *pgxpool.Pool, log *slog.Logger) error {
	b := retry.NewExponential(100 * time.Millisecond)
	b = retry.WithCappedDuration(5*time.Second, b)
	return retry.Do(ctx, b, func(ctx context.Context) error {
		err := EnsureSchema(ctx, pool)
		var ce *pgconn.ConnectError
		if errors.As(err, &ce) {
			log.Warn("ledger: database not reachable yet, retrying", "err", err)
			return retry.RetryableError(err)
		}
		return err
	})
}

// consume runs handler as consumer of InvoicePaid.v1 until ctx ends.
func consume(ctx context.Context, cfg Config, consumer string, handler events.Handler, log *slog.Logger) error {
	pool, err := pgxpool.New(ctx, cfg.Database.SessionURL())
	if err != nil {
		return fmt.Errorf("database: %w", err)
	}
	defer pool.Close()
	if err := waitSchema(ctx, pool, log); err != nil {
		if ctx.Err() != nil {
			return nil // stopped while waiting
		}
		return err
	}
	nc, err := nats.Connect(cfg.NATS.URL, nats.Name("aurora-example-ledger"), nats.MaxReconnects(-1),
		nats.RetryOnFailedConnect(true), nats.ReconnectWait(time.Second))
	if err != nil {
		return fmt.Errorf("nats: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	c, err := events.NewClient(pool, js, cfg.Events, events.WithLogger(log))
	if err != nil {
		return err
	}
	log.Info("ledger: consuming", "consumer", consumer, "type", inbox.EventInvoicePaid)
	return c.Consume(ctx, consumer, []string{inbox.EventInvoicePaid}, handler)
}
