package admin

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/aurora-billing/aurora/inbox"
	"github.com/spf13/cobra"
)

// newInboxResolveCmd is `auroractl inbox resolve <event-id>`: a same-second
// ambiguity shown, and resolved from Stripe's current object.
func newInboxResolveCmd(asJSON *bool) *cobra.Command {
	var (
		fromProvider, yes bool
		reason, actor     string
	)
	cmd := &cobra.Command{
		Use:   "resolve <event-id> [--from-provider [--reason … --yes]]",
		Short: "Show a same-second ambiguity; with --from-provider, resolve it from Stripe's current object (audited)",
		Long: `Two events of one subscription (or opposite invoice outcomes of one customer) in the same
Stripe second cannot be ordered, so the inbox holds the entitlement at what came before and
keeps both as one ambiguity (docs/inbox.md, "Same-second events").

  resolve <event-id>                                  the ambiguity: its events and the held projections
  resolve <event-id> --from-provider                  also fetch the subscription or invoices from Stripe
                                                      (AURORA_STRIPE_API_KEY, AURORA_STRIPE_API_BASE) and
                                                      show what they would project; writes nothing
  resolve <event-id> --from-provider --reason … --yes apply it: projections and entitlement follow Stripe,
                                                      the events are settled 'resolved', and operator,
                                                      reason, Stripe's objects and the projection are recorded

Exit codes: 3 unknown event, or Stripe answered 404 for the subscription or an invoice (not of
this key's account or mode), 4 not part of an ambiguity / already resolved / changed meanwhile,
5 Stripe's state cannot decide (unmapped price, unsettled invoice, another customer), 1 Stripe
unreachable or failing (transport error, 5xx, a key Stripe rejects).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if yes && !fromProvider {
				return invalidInput("--yes applies the provider's state: pass --from-provider")
			}
			in := inbox.ResolveInput{EventID: args[0], Operator: Actor(actor), Reason: reason}
			if yes {
				if err := in.Validate(); err != nil {
					return &ExitError{Code: ExitInvalidInput, Msg: err.Error() + " (pass --reason)", Err: err}
				}
			}
			var provider inbox.Provider
			if fromProvider {
				key := os.Getenv("AURORA_STRIPE_API_KEY")
				if key == "" {
					return invalidInput("--from-provider reads Stripe: set AURORA_STRIPE_API_KEY (and AURORA_STRIPE_API_BASE for a local emulator)")
				}
				provider = inbox.NewStripeProvider(key, os.Getenv("AURORA_STRIPE_API_BASE"), 0)
			}
			pool, err := inboxPool(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			out := cmd.OutOrStdout()
			switch {
			case !fromProvider:
				a, err := inbox.ReadAmbiguity(cmd.Context(), pool, in.EventID)
				if err != nil {
					return resolveExit(err)
				}
				if *asJSON {
					return inboxJSON(out, map[string]any{"ambiguity": a})
				}
				renderAmbiguity(out, a)
				if a.Status == "open" {
					fmt.Fprintf(out, "\nresolve it from Stripe's current state: auroractl inbox resolve %s --from-provider\n", in.EventID)
				}
				return nil
			case !yes:
				plan, err := inbox.PlanResolution(cmd.Context(), pool, provider, nil, in.EventID)
				if err != nil {
					return resolveExit(err)
				}
				if *asJSON {
					return inboxJSON(out, map[string]any{"dry_run": true, "ambiguity": plan.Ambiguity, "fetched_at": plan.FetchedAt,
						"would_project": plan.Would, "operator": in.Operator, "reason": in.Reason})
				}
				renderAmbiguity(out, plan.Ambiguity)
				fmt.Fprintf(out, "\nStripe now (fetched %s) would project:\n", plan.FetchedAt.UTC().Format(time.RFC3339))
				renderProjection(out, plan.Would)
				fmt.Fprintf(out, "\ndry run: nothing written; apply with: auroractl inbox resolve %s --from-provider --reason \"…\" --yes\n", in.EventID)
				return nil
			default:
				plan, err := inbox.ApplyResolution(cmd.Context(), pool, provider, nil, in)
				if err != nil {
					return resolveExit(err)
				}
				if *asJSON {
					return inboxJSON(out, map[string]any{"resolved": plan.Ambiguity, "projected": plan.Would})
				}
				fmt.Fprintf(out, "resolved ambiguity %d (%d events) by %s from Stripe's state:\n", plan.Ambiguity.ID, len(plan.Ambiguity.Events), in.Operator)
				renderProjection(out, plan.Would)
				return nil
			}
		},
	}
	cmd.Flags().BoolVar(&fromProvider, "from-provider", false, "fetch the subscription or invoices from Stripe and show what they would project")
	cmd.Flags().StringVar(&reason, "reason", "", "why the provider's state is applied (required with --yes; recorded)")
	cmd.Flags().StringVar(&actor, "actor", "", "who is acting (default $AURORA_ACTOR, else the OS user)")
	cmd.Flags().BoolVar(&yes, "yes", false, "apply (with --from-provider); without it nothing is written")
	return cmd
}

// resolveExit maps resolution errors to exit codes.
func resolveExit(err error) error {
	var pe *inbox.ProviderError
	switch {
	case errors.Is(err, inbox.ErrEventNotFound):
		return &ExitError{Code: ExitNotFound, Msg: err.Error(), Err: err}
	case errors.Is(err, inbox.ErrNotAmbiguous):
		return &ExitError{Code: ExitStateMismatch, Msg: err.Error() + "; see auroractl inbox inspect", Err: err}
	case errors.Is(err, inbox.ErrAmbiguityResolved):
		return &ExitError{Code: ExitStateMismatch, Msg: err.Error() + "; see auroractl inbox resolve <event-id>", Err: err}
	case errors.Is(err, inbox.ErrAmbiguityChanged):
		return &ExitError{Code: ExitStateMismatch, Msg: err.Error() + "; run the dry run again", Err: err}
	case errors.Is(err, inbox.ErrInvalidResolve):
		return &ExitError{Code: ExitInvalidInput, Msg: err.Error(), Err: err}
	case errors.Is(err, inbox.ErrProviderRefused):
		return &ExitError{Code: ExitRefused, Msg: err.Error(), Err: err}
	case errors.As(err, &pe) && pe.NotFound():
		return &ExitError{Code: ExitNotFound, Err: err, Msg: err.Error() +
			"; Stripe answered, and has no such object for this key: check AURORA_STRIPE_API_KEY is of the account and mode the events came from"}
	default:
		return err
	}
}

func renderAmbiguity(w io.Writer, a inbox.Ambiguity) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "ambiguity\t%d\n", a.ID)
	fmt.Fprintf(tw, "kind\t%s (%s)\n", a.Kind, a.Reason)
	if a.SubscriptionID != "" {
		fmt.Fprintf(tw, "subscription\t%s\n", a.SubscriptionID)
	}
	fmt.Fprintf(tw, "tenant\t%s\n", a.Tenant)
	fmt.Fprintf(tw, "stripe_second\t%s\n", a.EventSecond.UTC().Format(time.RFC3339))
	fmt.Fprintf(tw, "status\t%s\n", a.Status)
	fmt.Fprintf(tw, "opened_at\t%s\n", a.OpenedAt.UTC().Format(time.RFC3339))
	if r := a.Resolution; r != nil {
		fmt.Fprintf(tw, "resolved\t%s by %s from %s: %s\n", r.ResolvedAt.UTC().Format(time.RFC3339), r.Operator, r.Source, r.Reason)
	}
	_ = tw.Flush()
	fmt.Fprintln(w, "\nevents (same Stripe second, no order between them):")
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  EVENT ID\tTYPE\tSTATE\tSAYS")
	for _, ev := range a.Events {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", ev.EventID, ev.Type, ev.State, eventSays(ev))
	}
	_ = tw.Flush()
	fmt.Fprintln(w, "\nheld now:")
	renderProjection(w, a.Held)
}

func eventSays(ev inbox.AmbiguousEvent) string {
	switch {
	case ev.Subscription != nil:
		return subscriptionSays(*ev.Subscription)
	case ev.Invoice != nil:
		return fmt.Sprintf("invoice %s %s (subscription %s)", ev.Invoice.ID, ev.Invoice.Outcome, ev.Invoice.SubscriptionID)
	default:
		return "-"
	}
}

func subscriptionSays(s inbox.ProjectedSubscription) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s price %s", s.Status, inboxStr(s.PriceID))
	if s.Plan != nil {
		fmt.Fprintf(&b, " plan %s", *s.Plan)
	}
	if s.CancelAtPeriodEnd {
		b.WriteString(" cancel_at_period_end")
	}
	fmt.Fprintf(&b, " period_end %s", inboxTime(s.CurrentPeriodEnd))
	return b.String()
}

func renderProjection(w io.Writer, p inbox.Projection) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if p.Subscription != nil {
		fmt.Fprintf(tw, "  subscription %s\t%s\n", p.Subscription.ID, subscriptionSays(*p.Subscription))
	}
	for _, inv := range p.Invoices {
		st := ""
		if inv.ProviderStatus != "" {
			st = " (Stripe: " + inv.ProviderStatus + ")"
		}
		fmt.Fprintf(tw, "  invoice %s\t%s%s\n", inv.ID, inv.Outcome, st)
	}
	if p.InvoiceStatusKept {
		fmt.Fprintln(tw, "  customer invoice status\tkept (a later invoice outcome set it)")
	} else if p.InvoiceStatus != nil {
		fmt.Fprintf(tw, "  customer invoice status\t%s\n", *p.InvoiceStatus)
	}
	en := p.Entitlement
	fmt.Fprintf(tw, "  entitlement\tplan %s, subscription %s %s, billing %s, grace_until %s\n",
		inboxStr(en.Plan), inboxStr(en.SubscriptionID), inboxStr(en.SubscriptionStatus), en.BillingStatus, inboxTime(en.GraceUntil))
	_ = tw.Flush()
}
