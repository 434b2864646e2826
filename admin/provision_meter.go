package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/aurora-billing/aurora/provision"
	"github.com/spf13/cobra"
)

// newProvisionMeterCmd is `auroractl provision meter`: plan the feature's
// mapping (provision.PlanMeter), print it with what it does to staged
// items, and apply it (provision.ApplyMeter) only with --yes.
func newProvisionMeterCmd(asJSON *bool) *cobra.Command {
	var account, feature, eventName, meterID string
	var yes bool
	cmd := &cobra.Command{
		Use:   "meter",
		Short: "Map a feature to a Stripe meter: created, kept or adopted (--meter-id); a dry run without --yes",
		Long: `Map a feature to a Stripe meter on the destination account.

Without --yes it prints the plan and writes nothing (no meter is created at Stripe):
the mapping now and after, whether the meter is kept, created or adopted, and what a
REMAP does to staged items: items built for the current mapping version that are not
yet sent are quarantined feature_unmapped by the deliverer, and quarantined items built
for another version can be rebuilt for the new one with 'auroractl recovery restage
--feature F --account A' (same identifier, so Stripe deduplicates).

The meter: the mapped one when its event name is --event-name; else --meter-id (adopt
that existing meter; its event name is used); else an active Stripe meter already
recording --event-name (adopted: Stripe allows one active meter per event name, so a
feature can be moved back); else a new sum meter. A meter that is inactive or does not
sum is refused.`,
		Example: `  auroractl provision meter --account acct_123 --feature api_calls                       # the plan
  auroractl provision meter --account acct_123 --feature api_calls --event-name api_calls_v2 --yes
  auroractl provision meter --account acct_123 --feature api_calls --meter-id mtr_123 --yes   # adopt`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			api, err := stripeAPI()
			if err != nil {
				return err
			}
			pool, err := openPool(cmd)
			if err != nil {
				return err
			}
			defer pool.Close()
			if eventName == "" && meterID == "" {
				eventName = feature
			}
			ctx := cmd.Context()
			plan, err := provision.PlanMeter(ctx, pool, api, account, feature, eventName, meterID)
			if err != nil {
				return meterErr(err)
			}
			out := cmd.OutOrStdout()
			if !yes || plan.Action == provision.MappingUnchanged {
				if *asJSON {
					return json.NewEncoder(out).Encode(map[string]any{"plan": plan, "applied": false, "dry_run": !yes})
				}
				renderMeterPlan(out, plan)
				if plan.Action != provision.MappingUnchanged {
					fmt.Fprintln(out, "DRY RUN: nothing was written, no meter was created; add --yes to apply")
				}
				return nil
			}
			m, err := provision.ApplyMeter(ctx, pool, api, plan)
			if err != nil {
				return meterErr(err)
			}
			if *asJSON {
				return json.NewEncoder(out).Encode(map[string]any{"plan": plan, "applied": true, "mapping": m})
			}
			fmt.Fprintf(out, "feature %s → meter %s (event %s, mapping_version %d, %s)\n", m.Feature, m.MeterID, m.EventName, m.MappingVersion, plan.Meter)
			if plan.Action == provision.MappingRemap && plan.Staged.InFlight+plan.Staged.Restageable > 0 {
				fmt.Fprintf(out, "then, once the in-flight items are quarantined: auroractl recovery restage --feature %s --account %s --reason \"…\" --evidence \"meter %s, mapping_version %d\" --yes\n",
					feature, account, m.MeterID, m.MappingVersion)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&account, "account", "", "Stripe account id (required; equal to the services' AURORA_STRIPE_ACCOUNT)")
	cmd.Flags().StringVar(&feature, "feature", "", "feature name, e.g. api_calls (required)")
	cmd.Flags().StringVar(&eventName, "event-name", "", "meter event name (default: the feature, or the adopted meter's)")
	cmd.Flags().StringVar(&meterID, "meter-id", "", "adopt this existing Stripe meter (mtr_…) instead of creating one")
	cmd.Flags().BoolVar(&yes, "yes", false, "apply; without it nothing is written")
	_ = cmd.MarkFlagRequired("account")
	_ = cmd.MarkFlagRequired("feature")
	return cmd
}

func renderMeterPlan(w io.Writer, p provision.MeterPlan) {
	fmt.Fprintf(w, "feature %s on %s: %s\n", p.Feature, p.Account, p.Action)
	if p.Current != nil {
		fmt.Fprintf(w, "  now:    meter %s (event %s), mapping_version %d\n", p.Current.MeterID, p.Current.EventName, p.Current.MappingVersion)
	} else {
		fmt.Fprintln(w, "  now:    not mapped")
	}
	meter := p.Next.MeterID
	if p.Meter == provision.MeterCreate {
		meter = "(new, created at Stripe on --yes)"
	} else if p.Meter == provision.MeterAdopt {
		meter += " (adopted: an existing Stripe meter)"
	}
	fmt.Fprintf(w, "  after:  meter %s (event %s), mapping_version %d\n", meter, p.Next.EventName, p.Next.MappingVersion)
	if p.Action == provision.MappingUnchanged {
		fmt.Fprintln(w, "  nothing to do: the feature already maps to this meter")
	}
	if p.Action == provision.MappingRemap {
		fmt.Fprintf(w, "  staged: %d pending or leased items built for version %d: the deliverer will quarantine them feature_unmapped (one already being sent may reach the old meter)\n",
			p.Staged.InFlight, p.Current.MappingVersion)
	}
	if p.Staged.Restageable > 0 || p.Action == provision.MappingRemap {
		fmt.Fprintf(w, "          %d quarantined items built for another version than %d: restageable after the change\n", p.Staged.Restageable, p.Next.MappingVersion)
		fmt.Fprintf(w, "  then:   auroractl recovery restage --feature %s --account %s   (lists; add --reason, --evidence, --yes to rebuild under the same identifiers)\n", p.Feature, p.Account)
	}
}

func meterErr(err error) error {
	switch {
	case errors.Is(err, provision.ErrMeterUnusable):
		return &ExitError{Code: ExitRefused, Msg: err.Error(), Err: err}
	case errors.Is(err, provision.ErrMappingMoved):
		return &ExitError{Code: ExitStateMismatch, Msg: err.Error() + "; run the command again without --yes and decide on the new plan", Err: err}
	}
	return provisionErr(err)
}
