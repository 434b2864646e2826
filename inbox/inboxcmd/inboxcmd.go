// Package inboxcmd is the cobra command that runs the Stripe webhook inbox,
// shared by the aurora-inbox binary and `aurora inbox`.
package inboxcmd

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/aurora-billing/aurora/inbox"
	"github.com/aurora-billing/aurora/shared/config"
	"github.com/aurora-billing/aurora/shared/ops"
	"github.com/spf13/cobra"
)

// New returns the command named use. --validate loads and checks the
// configuration, prints it without secrets and exits; an invalid
// configuration is an error wrapping config.ErrInvalid that names the
// variable (callers exit 2).
func New(use string) *cobra.Command {
	var validate bool
	cmd := &cobra.Command{
		Use:   use,
		Short: "Serve POST /webhooks/stripe and run the inbox worker (seed 003)",
		Long: `Serve the Stripe webhook endpoint (verify, store durably, then 200) with /healthz,
/readyz and /metrics on the same listener, and run the worker that projects
customer linkage, subscriptions, invoices and entitlements.

Environment: AURORA_INBOX_ADDR (default :8090), AURORA_STRIPE_WEBHOOK_SECRET
(required; comma-separated for rotation), AURORA_DATABASE_URL,
AURORA_INBOX_POLL_MS (1000..60000, default 5000), AURORA_INBOX_BATCH_SIZE
(1..25, default 10).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var cfg inbox.Config
			if err := config.Load(&cfg); err != nil {
				return err
			}
			if validate {
				fmt.Fprintln(cmd.OutOrStdout(), "configuration valid: "+cfg.String())
				return nil
			}
			log := ops.NewLogger(os.Stderr, slog.LevelInfo)
			return inbox.Run(cmd.Context(), cfg, log)
		},
	}
	cmd.Flags().BoolVar(&validate, "validate", false, "check the configuration and exit")
	return cmd
}
