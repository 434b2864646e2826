// Package reconcilercmd is the cobra command that runs the reconciler,
// shared by the aurora-reconciler binary and `aurora reconciler`.
package reconcilercmd

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"

	"github.com/aurora-billing/aurora/reconciler"
	"github.com/aurora-billing/aurora/shared/config"
	"github.com/aurora-billing/aurora/shared/ops"
	"github.com/spf13/cobra"
)

// New returns the command named use. --validate loads and checks the
// configuration, prints it without secrets and exits; --once runs one
// provider reconciliation, prints its report as JSON and exits (1 when it
// failed). An invalid configuration is an error wrapping config.ErrInvalid
// that names the variable and its range (callers exit 2).
func New(use string) *cobra.Command {
	var validate, once bool
	cmd := &cobra.Command{
		Use:   use,
		Short: "Reconcile the ledger with Stripe on a schedule: summaries, error reports, invoices; confirm what Stripe shows",
		Long: `Run a provider reconciliation every AURORA_RECONCILER_INTERVAL_SECONDS (default 900)
with /healthz, /readyz and /metrics on AURORA_RECONCILER_HTTP_ADDR (default 127.0.0.1:9105).

Each run: the local check's drift; Stripe's meter error reports the inbox stored;
meter event summaries per customer and meter for windows older than the settle lag;
finalized invoices. Differences become reconciliation items (auroractl reconcile list);
accepted items a settled, matching window covers become confirmed.

Environment: AURORA_RECONCILER_SETTLE_LAG_SECONDS (0..172800, default 3600),
AURORA_RECONCILER_LOOKBACK_HOURS (1..840, default 72),
AURORA_RECONCILER_CONFIRM_HORIZON_SECONDS (settle lag + 3600 .. 3024000, default 172800),
AURORA_RECONCILER_REQUESTS_PER_SECOND (1..100, default 20), AURORA_STRIPE_API_KEY,
AURORA_STRIPE_API_BASE, AURORA_STRIPE_ACCOUNT, AURORA_DATABASE_URL.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var cfg reconciler.Config
			if err := config.Load(&cfg); err != nil {
				return err
			}
			if validate {
				fmt.Fprintln(cmd.OutOrStdout(), "configuration valid: "+cfg.String())
				return nil
			}
			log := ops.NewLogger(os.Stderr, slog.LevelInfo)
			rep, err := reconciler.Run(cmd.Context(), cfg, once, log)
			if once && rep.RunID != 0 {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				_ = enc.Encode(rep)
			}
			return err
		},
	}
	cmd.Flags().BoolVar(&validate, "validate", false, "check the configuration and exit")
	cmd.Flags().BoolVar(&once, "once", false, "run one provider reconciliation, print its report as JSON and exit")
	return cmd
}
