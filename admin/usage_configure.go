package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/aurora-billing/aurora/recovery"
	"github.com/aurora-billing/aurora/shared/config"
	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/usage"
	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"
)

// newUsageCmd is `auroractl usage`: recording usage without Go (the SQL
// API's settings, single events, backfills from files).
func newUsageCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "usage",
		Short: "Record usage (one event, or a backfill from a file) and configure the SQL API",
		Long: `Record usage without writing Go.

  configure   the SQL API's settings (aurora.record_usage): destination account, mode, period,
              feature sources; they must equal the services' AURORA_STRIPE_ACCOUNT,
              AURORA_STRIPE_MODE, AURORA_USAGE_PERIOD and AURORA_FEATURE_SOURCES
  record      one usage event or correction
  import      a JSONL or access-log file (the demo's formats), in batches

record and import go through the same rules as the services (usage.Gate) with the
destination, mode and period of AURORA_STRIPE_ACCOUNT, AURORA_STRIPE_MODE,
AURORA_USAGE_PERIOD and the sources of AURORA_FEATURE_SOURCES.`,
	}
	cmd.AddCommand(newUsageConfigureCmd(), newUsageRecordCmd(), newUsageImportCmd())
	return cmd
}

// usageEnv is what the usage commands read from the environment: the
// services' export variables and AURORA_FEATURE_SOURCES.
type usageEnv struct {
	config.Export
	// FeatureSources: AURORA_FEATURE_SOURCES (usage.ParseSources).
	FeatureSources string `env:"FEATURE_SOURCES"`
}

// Validate checks the export variables and the sources' syntax.
func (u usageEnv) Validate() error {
	var src error
	if _, err := usage.ParseSources(u.FeatureSources); err != nil {
		src = &config.RangeError{Var: config.Prefix + "FEATURE_SOURCES", Value: u.FeatureSources, Allowed: "feature:counters|events,…"}
	}
	return errors.Join(u.Export.Validate(), src)
}

// exportSettings reads usageEnv as the settings the services record with.
func exportSettings() (usage.SQLSettings, error) {
	var e usageEnv
	if err := config.Load(&e); err != nil {
		return usage.SQLSettings{}, &ExitError{Code: ExitInvalidInput, Msg: err.Error(), Err: err}
	}
	src, _ := usage.ParseSources(e.FeatureSources) // checked by Validate
	return usage.SQLSettings{DestinationAccount: e.StripeAccount, Mode: identity.Mode(e.StripeMode), Period: usage.Period(e.UsagePeriod), Sources: src}, nil
}

func newUsageConfigureCmd() *cobra.Command {
	var account, mode, period, sources, reason, actor string
	var yes, asJSON bool
	cmd := &cobra.Command{
		Use:   "configure",
		Short: "Show or set the SQL API's settings (defaults: the services' AURORA_* export variables; writes only with --yes)",
		Example: `  auroractl usage configure                       # what is stored, and what the environment says
  auroractl usage configure --sources api_calls:events --reason "enable SQL recording" --yes`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			want, err := exportSettings()
			if err != nil {
				return err
			}
			if account != "" {
				want.DestinationAccount = account
			}
			if mode != "" {
				want.Mode = identity.Mode(mode)
			}
			if period != "" {
				want.Period = usage.Period(period)
			}
			if cmd.Flags().Changed("sources") {
				if want.Sources, err = usage.ParseSources(sources); err != nil {
					return invalidInput("--sources: %v", err)
				}
			}
			if err := want.Validate(); err != nil {
				return invalidInput("%v", err)
			}
			pool, err := openPool(cmd)
			if err != nil {
				return err
			}
			defer pool.Close()
			ctx := cmd.Context()
			current, err := usage.ReadSQLSettings(ctx, pool)
			configured := err == nil
			if err != nil && !errors.Is(err, usage.ErrNotConfigured) {
				return err
			}
			var acctMode *string
			_ = pool.QueryRow(ctx, `SELECT mode FROM stripe_accounts WHERE account_id = $1`, want.DestinationAccount).Scan(&acctMode)
			var warnings []string
			switch {
			case acctMode == nil:
				warnings = append(warnings, fmt.Sprintf("account %s is not provisioned (auroractl provision account): its items will be quarantined account_unconfirmed", want.DestinationAccount))
			case *acctMode != string(want.Mode):
				warnings = append(warnings, fmt.Sprintf("account %s is provisioned in %s mode, not %s: its items will be quarantined mode_mismatch", want.DestinationAccount, *acctMode, want.Mode))
			}
			view := map[string]any{"configured": configured, "stored": nil, "new": want, "applied": false, "warnings": warnings}
			if configured {
				view["stored"] = current
			}
			if !yes {
				if asJSON {
					return json.NewEncoder(cmd.OutOrStdout()).Encode(view)
				}
				w := cmd.OutOrStdout()
				if configured {
					fmt.Fprintf(w, "stored:  %s\n", settingsLine(current))
				} else {
					fmt.Fprintln(w, "stored:  (none: aurora.record_usage refuses with AU010 until configured)")
				}
				fmt.Fprintf(w, "new:     %s\n", settingsLine(want))
				for _, wn := range warnings {
					fmt.Fprintln(w, "warning: "+wn)
				}
				fmt.Fprintln(w, "dry run: nothing written; add --reason \"…\" --yes to store the new settings")
				return nil
			}
			if strings.TrimSpace(reason) == "" {
				return invalidInput("--reason is required with --yes (say why the settings change)")
			}
			var actionID int64
			err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if err := usage.WriteSQLSettings(ctx, tx, want, Actor(actor)); err != nil {
					return err
				}
				var observed any
				if configured {
					observed = current
				}
				actionID, err = recovery.RecordOperatorAction(ctx, tx, recovery.OperatorAction{
					Action: "usage_configure", Actor: Actor(actor), Reason: reason, Subject: want, Observed: observed})
				return err
			})
			if err != nil {
				return err
			}
			view["applied"], view["action_id"] = true, actionID
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(view)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "stored:  %s (recovery action %d)\n", settingsLine(want), actionID)
			for _, wn := range warnings {
				fmt.Fprintln(cmd.OutOrStdout(), "warning: "+wn)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&account, "account", "", "destination account (default AURORA_STRIPE_ACCOUNT)")
	cmd.Flags().StringVar(&mode, "mode", "", "test|live (default AURORA_STRIPE_MODE)")
	cmd.Flags().StringVar(&period, "period", "", "hour|day|month (default AURORA_USAGE_PERIOD)")
	cmd.Flags().StringVar(&sources, "sources", "", "feature:counters|events,… (default AURORA_FEATURE_SOURCES)")
	cmd.Flags().StringVar(&reason, "reason", "", "why (required with --yes)")
	cmd.Flags().StringVar(&actor, "actor", "", "who (default AURORA_ACTOR, else the OS user)")
	cmd.Flags().BoolVar(&yes, "yes", false, "write the settings (without it: a dry run)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func settingsLine(s usage.SQLSettings) string {
	src := s.Sources.String()
	if src == "" {
		src = "(none: every feature counts, its events are quarantined period_buffered)"
	}
	return fmt.Sprintf("account=%s mode=%s period=%s sources=%s", s.DestinationAccount, s.Mode, s.Period, src)
}
