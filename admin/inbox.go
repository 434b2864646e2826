package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/aurora-billing/aurora/inbox"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
)

// newInboxCmd is `auroractl inbox …`: the Stripe webhook inbox's read-only
// inventory and dead letters, and the explicit single-event requeue of seed
// 003. No command prints a payload unless `inspect --show-payload`.
func newInboxCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "inbox",
		Short: "Inspect the Stripe webhook inbox, requeue single dead letters, resolve same-second ambiguities, map prices to plans",
	}
	cmd.PersistentFlags().BoolVar(&asJSON, "json", false, "print JSON on stdout")
	cmd.AddCommand(newInboxInventoryCmd(&asJSON), newInboxListCmd(&asJSON), newInboxInspectCmd(&asJSON), newInboxRequeueCmd(&asJSON),
		newInboxPlansCmd(&asJSON), newInboxResolveCmd(&asJSON))
	return cmd
}

func inboxPool(ctx context.Context) (*pgxpool.Pool, error) {
	url, err := sessionURL()
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, &ExitError{Code: ExitFailure, Msg: "database: " + err.Error(), Err: err}
	}
	return pool, nil
}

func inboxJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func newInboxInventoryCmd(asJSON *bool) *cobra.Command {
	return &cobra.Command{
		Use:   "inventory",
		Short: "Pending and dead-letter counts and the highest attempt count (the seed's read-only query)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pool, err := inboxPool(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			inv, err := inbox.ReadInventory(cmd.Context(), pool)
			if err != nil {
				return err
			}
			if *asJSON {
				return inboxJSON(cmd.OutOrStdout(), inv)
			}
			highest := "-"
			if inv.HighestAttemptCount != nil {
				highest = fmt.Sprint(*inv.HighestAttemptCount)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "pending %d\ndead_letter %d\nhighest_attempt_count %s\n", inv.Pending, inv.DeadLetter, highest)
			return nil
		},
	}
}

func newInboxListCmd(asJSON *bool) *cobra.Command {
	var (
		deadLetter bool
		limit      int
	)
	cmd := &cobra.Command{
		Use:   "list --dead-letter",
		Short: "List dead-lettered events, oldest first (never payloads or customer ids)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !deadLetter {
				return invalidInput("list needs --dead-letter")
			}
			if limit < 1 || limit > 10000 {
				return invalidInput("--limit must be 1..10000, got %d", limit)
			}
			pool, err := inboxPool(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			events, err := inbox.ListDeadLetters(cmd.Context(), pool, limit)
			if err != nil {
				return err
			}
			if *asJSON {
				return inboxJSON(cmd.OutOrStdout(), map[string]any{"dead_letters": events})
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "EVENT ID\tTYPE\tREASON\tATTEMPTS\tDEAD LETTER AT")
			for _, e := range events {
				fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\n", e.EventID, e.Type, inboxStr(e.LastReason), e.Attempts, inboxTime(e.DeadLetterAt))
			}
			return w.Flush()
		},
	}
	cmd.Flags().BoolVar(&deadLetter, "dead-letter", false, "list dead letters (required)")
	cmd.Flags().IntVar(&limit, "limit", 100, "at most this many events (1..10000)")
	return cmd
}

func newInboxInspectCmd(asJSON *bool) *cobra.Command {
	var showPayload bool
	cmd := &cobra.Command{
		Use:   "inspect <event-id>",
		Short: "Show one event's state, attempts, reason and requeue history (payload only with --show-payload)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			pool, err := inboxPool(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			e, err := inbox.Inspect(cmd.Context(), pool, args[0], showPayload)
			if err != nil {
				return inboxExit(err)
			}
			if *asJSON {
				return inboxJSON(cmd.OutOrStdout(), e)
			}
			renderEvent(cmd.OutOrStdout(), e)
			return nil
		},
	}
	cmd.Flags().BoolVar(&showPayload, "show-payload", false, "also print the raw Stripe event body (customer data: handle with care)")
	return cmd
}

func newInboxRequeueCmd(asJSON *bool) *cobra.Command {
	var (
		reason, actor string
		yes           bool
	)
	cmd := &cobra.Command{
		Use:   "requeue <event-id> --reason … --yes",
		Short: "Re-enable exactly one dead letter with a fresh attempt budget, recording operator and reason",
		Long: `Re-enable exactly one dead letter: its attempt budget is reset, it becomes due now, and
the operator, the reason and the prior attempts are recorded in billing_event_requeues.
Seed 003: compare the latest Stripe subscription/invoice state and fix configuration
first; never replay batches. Without --yes, prints the event and the change, writes nothing.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			in := inbox.RequeueInput{EventID: args[0], Operator: Actor(actor), Reason: reason}
			if err := in.Validate(); err != nil {
				return &ExitError{Code: ExitInvalidInput, Msg: err.Error() + " (pass --reason)", Err: err}
			}
			pool, err := inboxPool(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			out := cmd.OutOrStdout()
			if !yes {
				cur, err := inbox.Inspect(cmd.Context(), pool, in.EventID, false)
				if err != nil {
					return inboxExit(err)
				}
				if cur.State != inbox.StateDeadLetter {
					return inboxExit(&inbox.StateError{EventID: in.EventID, State: cur.State})
				}
				if *asJSON {
					return inboxJSON(out, map[string]any{"dry_run": true, "event": cur, "operator": in.Operator, "reason": in.Reason,
						"change": map[string]any{"state": "dead_letter → pending", "attempts": fmt.Sprintf("%d → 0", cur.Attempts)}})
				}
				renderEvent(out, cur)
				fmt.Fprintf(out, "\ndry run: would requeue this one event as %q with reason %q:\n  state dead_letter → pending (due now), attempts %d → 0\nrun again with --yes to apply\n",
					in.Operator, in.Reason, cur.Attempts)
				return nil
			}
			e, err := inbox.RequeueDeadLetter(cmd.Context(), pool, nil, in)
			if err != nil {
				return inboxExit(err)
			}
			if *asJSON {
				return inboxJSON(out, map[string]any{"requeued": e})
			}
			fmt.Fprintf(out, "requeued %s by %s: pending, attempts 0\n", e.EventID, in.Operator)
			return nil
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why this event is requeued (required; recorded)")
	cmd.Flags().StringVar(&actor, "actor", "", "who is acting (default $AURORA_ACTOR, else the OS user)")
	cmd.Flags().BoolVar(&yes, "yes", false, "apply; without it nothing is written")
	return cmd
}

// inboxExit maps inbox errors to exit codes.
func inboxExit(err error) error {
	var se *inbox.StateError
	switch {
	case errors.Is(err, inbox.ErrEventNotFound):
		return &ExitError{Code: ExitNotFound, Msg: err.Error(), Err: err}
	case errors.As(err, &se):
		return &ExitError{Code: ExitStateMismatch, Msg: err.Error() + "; only a dead letter can be requeued", Err: err}
	case errors.Is(err, inbox.ErrInvalidRequeue):
		return &ExitError{Code: ExitInvalidInput, Msg: err.Error(), Err: err}
	default:
		return err
	}
}

func renderEvent(w io.Writer, e inbox.EventInfo) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "event_id\t%s\n", e.EventID)
	fmt.Fprintf(tw, "type\t%s\n", e.Type)
	fmt.Fprintf(tw, "api_version\t%s\n", inboxStr(e.APIVersion))
	fmt.Fprintf(tw, "event_created\t%s\n", inboxTime(e.EventCreated))
	fmt.Fprintf(tw, "received_at\t%s\n", e.ReceivedAt.UTC().Format(time.RFC3339))
	fmt.Fprintf(tw, "state\t%s\n", e.State)
	fmt.Fprintf(tw, "attempts\t%d\n", e.Attempts)
	fmt.Fprintf(tw, "next_attempt_at\t%s\n", e.NextAttemptAt.UTC().Format(time.RFC3339))
	fmt.Fprintf(tw, "last_reason\t%s\n", inboxStr(e.LastReason))
	fmt.Fprintf(tw, "last_error\t%s\n", inboxStr(e.LastError))
	fmt.Fprintf(tw, "outcome\t%s\n", inboxStr(e.Outcome))
	fmt.Fprintf(tw, "processed_at\t%s\n", inboxTime(e.ProcessedAt))
	fmt.Fprintf(tw, "dead_letter_at\t%s\n", inboxTime(e.DeadLetterAt))
	for _, r := range e.Requeues {
		fmt.Fprintf(tw, "requeued\t%s by %s: %s (prior attempts %d, reason %s)\n", r.RequeuedAt.UTC().Format(time.RFC3339), r.Operator, r.Reason, r.PriorAttempts, inboxStr(r.PriorReason))
	}
	_ = tw.Flush()
	if e.Payload != nil {
		fmt.Fprintf(w, "payload:\n%s\n", *e.Payload)
	}
}

func inboxStr(s *string) string {
	if s == nil || *s == "" {
		return "-"
	}
	return *s
}

func inboxTime(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}
