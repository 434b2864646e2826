package admin

import (
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/aurora-billing/aurora/inbox"
	"github.com/spf13/cobra"
)

// newInboxPlansCmd is `auroractl inbox plans list|set`: the webhook side's
// price → plan table (stripe_price_plans), each change audited with
// operator and reason (stripe_price_plan_changes).
func newInboxPlansCmd(asJSON *bool) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "plans",
		Short: "List and set the Stripe price → plan table the inbox grants plans from (audited)",
		Long: `The inbox grants a tenant the plan its subscription's Stripe price maps to in
stripe_price_plans. An empty table defers every subscription
stripe_price_config_missing; a price not in it defers unmapped_stripe_price.

  list  every mapping with its last audited change
  set   map one price to a plan: without --yes prints the change and what it touches,
        with --yes applies it and records operator, reason and the prior plan

A change applies to events projected from then on: a stored subscription keeps its
projected plan until its next event; deferred events pick the mapping up at their next
attempt; their dead letters need 'auroractl inbox requeue' one by one.`,
	}
	cmd.AddCommand(newInboxPlansListCmd(asJSON), newInboxPlansSetCmd(asJSON))
	return cmd
}

func newInboxPlansListCmd(asJSON *bool) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List every price → plan mapping with its last audited change",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pool, err := inboxPool(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			plans, err := inbox.ListPricePlans(cmd.Context(), pool)
			if err != nil {
				return err
			}
			if *asJSON {
				return inboxJSON(cmd.OutOrStdout(), map[string]any{"plans": plans})
			}
			if len(plans) == 0 {
				fmt.Fprintln(cmd.OutOrStdout(), "no price is mapped: every subscription is deferred stripe_price_config_missing\n(map one with: auroractl inbox plans set --price price_… --plan … --reason … --yes)")
				return nil
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "PRICE\tPLAN\tCREATED AT\tLAST CHANGED\tBY\tREASON")
			for _, p := range plans {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", p.PriceID, p.Plan, p.CreatedAt.UTC().Format(time.RFC3339),
					inboxTime(p.LastChangedAt), inboxStr(p.LastChangedBy), inboxStr(p.LastReason))
			}
			return w.Flush()
		},
	}
}

func newInboxPlansSetCmd(asJSON *bool) *cobra.Command {
	var (
		price, plan, reason, actor string
		yes                        bool
	)
	cmd := &cobra.Command{
		Use:   "set --price <price-id> --plan <plan> --reason … [--yes]",
		Short: "Map one Stripe price to a plan (read-only unless --yes; audited with operator and reason)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			in := inbox.PricePlanInput{PriceID: price, Plan: plan, Operator: Actor(actor), Reason: reason}
			if err := in.Validate(); err != nil {
				return &ExitError{Code: ExitInvalidInput, Msg: err.Error() + " (pass --price, --plan and --reason)", Err: err}
			}
			pool, err := inboxPool(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			out := cmd.OutOrStdout()
			var ch inbox.PricePlanChange
			if yes {
				ch, err = inbox.SetPricePlan(cmd.Context(), pool, nil, in)
			} else {
				ch, err = inbox.PreviewPricePlan(cmd.Context(), pool, in)
			}
			if errors.Is(err, inbox.ErrInvalidPricePlan) {
				return &ExitError{Code: ExitInvalidInput, Msg: err.Error(), Err: err}
			}
			if err != nil {
				return err
			}
			if *asJSON {
				return inboxJSON(out, map[string]any{"dry_run": !yes, "change": ch})
			}
			prior := "(not mapped)"
			if ch.PriorPlan != nil {
				prior = *ch.PriorPlan
			}
			switch {
			case ch.Unchanged:
				fmt.Fprintf(out, "%s already maps to %s: nothing to change\n", ch.PriceID, ch.Plan)
				return nil
			case !yes:
				fmt.Fprintf(out, "dry run: would map %s: %s → %s as %q with reason %q\n", ch.PriceID, prior, ch.Plan, in.Operator, in.Reason)
			default:
				fmt.Fprintf(out, "mapped %s: %s → %s by %s at %s\n", ch.PriceID, prior, ch.Plan, in.Operator, inboxTime(ch.ChangedAt))
			}
			fmt.Fprintf(out, "  stored subscriptions with this price: %d (they keep their projected plan until their next event)\n", ch.Subscriptions)
			fmt.Fprintf(out, "  events waiting for a mapping: %d pending (retried at their next attempt), %d dead letters (requeue each with auroractl inbox requeue)\n",
				ch.WaitingPending, ch.WaitingDeadLetters)
			if !yes {
				fmt.Fprintln(out, "run again with --yes to apply")
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&price, "price", "", "Stripe price id, e.g. price_… (required)")
	cmd.Flags().StringVar(&plan, "plan", "", "the plan this price grants (required)")
	cmd.Flags().StringVar(&reason, "reason", "", "why the mapping changes (required; recorded)")
	cmd.Flags().StringVar(&actor, "actor", "", "who is acting (default $AURORA_ACTOR, else the OS user)")
	cmd.Flags().BoolVar(&yes, "yes", false, "apply; without it nothing is written")
	return cmd
}
