// Command aurora runs every aurora service and the demo from one binary:
//
//	aurora relay            tail committed outbox rows into JetStream
//	aurora deliverer        claim, send to Stripe, record outcomes
//	aurora stripe-emulator  a local Stripe meter-events emulator
//	aurora inbox            the Stripe webhook inbox and its worker
//	aurora reconciler       reconcile the ledger with Stripe, confirm what it shows
//	aurora gauges           the database-derived gauges operators watch (one replica)
//	aurora demo             the whole export pipeline on real usage
//	aurora migrate          apply the schema (same as auroractl migrate up)
//
// Every service subcommand takes --validate: load and check its
// configuration, print it without secrets, and exit (0 valid, 2 invalid).
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/aurora-billing/aurora/migrations"
	"github.com/aurora-billing/aurora/shared/config"
	"github.com/aurora-billing/aurora/shared/ops"
	"github.com/spf13/cobra"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}

// newRootCmd returns the aurora command tree.
func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "aurora",
		Short:         "aurora moves billing facts between Postgres and Stripe with money-grade guarantees",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(
		newMigrateCmd(),
		newProbeCmd(),
		newDemoCmd(),
		// subcommands: add one line each, below this marker
		newDelivererCmd(),
		newGaugesCmd(),
		newRelayCmd(),
		newReporterCmd(),
		newInboxCmd(),
		newReconcilerCmd(),
		newStripeEmulatorCmd(),
	)
	installVarHooks(root)
	return root
}

func run(ctx context.Context, args []string) int {
	root := newRootCmd()
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	fmt.Fprintln(os.Stderr, "aurora: "+err.Error())
	msg := err.Error()
	cobraUsage := strings.HasPrefix(msg, "unknown command") || strings.HasPrefix(msg, "accepts ") ||
		strings.HasPrefix(msg, "requires ") || strings.HasPrefix(msg, "unknown flag") || strings.HasPrefix(msg, "required flag")
	if errors.Is(err, config.ErrInvalid) || isUsageError(err) || cobraUsage {
		return 2
	}
	return 1
}

// usageError marks invalid command-line use (exit 2).
type usageError struct{ error }

func (u usageError) Unwrap() error { return u.error }

func isUsageError(err error) bool {
	var u usageError
	return errors.As(err, &u)
}

// logger writes JSON logs (one object per line) to stderr. Logs never carry payloads,
// customer ids, signatures or keys.
func logger() *slog.Logger {
	return ops.NewLogger(os.Stderr, slog.LevelInfo)
}

func newMigrateCmd() *cobra.Command {
	var validate bool
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Apply pending schema migrations to AURORA_DATABASE_URL",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var db config.Database
			if err := config.Load(&db); err != nil {
				return err
			}
			if validate {
				fmt.Fprintln(cmd.OutOrStdout(), "configuration valid")
				return nil
			}
			res, err := migrations.Up(cmd.Context(), db.URL)
			if err != nil {
				return err
			}
			logger().Info("migrations applied", "count", len(res))
			return nil
		},
	}
	cmd.Flags().BoolVar(&validate, "validate", false, "check the configuration and exit")
	return cmd
}
