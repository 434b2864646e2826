package admin

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/aurora-billing/aurora/shared/events"
	"github.com/spf13/cobra"
)

// newEventsCmd is `auroractl events …`: the domain-event outbox/inbox of
// shared/events (docs/events.md). list and inspect only read; requeue and
// cleanup-stuck print what they would change and write only with --yes. No
// command prints a payload unless `inspect --show-payload`.
func newEventsCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "events",
		Short: "Inspect domain events, requeue one dead letter, acknowledge stuck events (docs/events.md)",
	}
	cmd.PersistentFlags().BoolVar(&asJSON, "json", false, "print JSON on stdout")
	cmd.AddCommand(newEventsListCmd(&asJSON), newEventsInspectCmd(&asJSON), newEventsRequeueCmd(&asJSON), newEventsCleanupStuckCmd(&asJSON))
	return cmd
}

func newEventsListCmd(asJSON *bool) *cobra.Command {
	var (
		status, typ, consumer string
		deadLetter            bool
		limit                 int
	)
	cmd := &cobra.Command{
		Use:   "list [--status S] [--type T] | --dead-letter [--consumer C]",
		Short: "List outbox events oldest first, or the consumers' dead letters (never payloads)",
		Long: `Without --dead-letter: event_outbox rows, oldest first, filtered by --status (pending,
dispatching, dispatched, acknowledged, failed, dead_letter) and --type ("InvoicePaid.v1").
With --dead-letter: every consumer's inbox dead letter (or --consumer's), oldest first; each is
requeued with ` + "`auroractl events requeue <event-id> --consumer <consumer> --reason … --yes`" + `.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit < 1 || limit > 1000 {
				return invalidInput("--limit must be 1..1000, got %d", limit)
			}
			if consumer != "" && !deadLetter {
				return invalidInput("--consumer goes with --dead-letter")
			}
			if deadLetter && (status != "" || typ != "") {
				return invalidInput("--dead-letter lists inbox dead letters; it takes --consumer, not --status or --type")
			}
			if consumer != "" {
				if err := events.ValidateConsumer(consumer, []string{"Any.v1"}); err != nil {
					return eventsExit(err)
				}
			}
			pool, err := inboxPool(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			out := cmd.OutOrStdout()
			if deadLetter {
				rows, err := events.ListDeadLetters(cmd.Context(), pool, consumer, limit)
				if err != nil {
					return eventsExit(err)
				}
				if *asJSON {
					if rows == nil {
						rows = []events.InboxRow{}
					}
					return inboxJSON(out, map[string]any{"dead_letters": rows})
				}
				w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, "EVENT ID\tTYPE\tCONSUMER\tREASON\tATTEMPTS\tDEAD LETTER AT")
				for _, r := range rows {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\n", r.EventID, r.EventType, r.Consumer, orDash(r.DeadLetterReason), r.Attempts, inboxTime(r.DeadLetteredAt))
				}
				return w.Flush()
			}
			rows, err := events.List(cmd.Context(), pool, events.ListFilter{Status: events.Status(status), Type: typ, Limit: limit})
			if err != nil {
				return eventsExit(err)
			}
			if *asJSON {
				if rows == nil {
					rows = []events.Row{}
				}
				return inboxJSON(out, map[string]any{"events": rows})
			}
			w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "EVENT ID\tTYPE\tSTATUS\tATTEMPTS\tREASON\tCREATED AT\tDISPATCHED AT")
			for _, r := range rows {
				fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", r.ID, r.Type, r.Status, r.Attempts, orDash(r.LastReason),
					r.CreatedAt.UTC().Format(time.RFC3339), inboxTime(r.DispatchedAt))
			}
			return w.Flush()
		},
	}
	cmd.Flags().StringVar(&status, "status", "", "only events in this outbox status")
	cmd.Flags().StringVar(&typ, "type", "", `only events of this type ("Name.v1")`)
	cmd.Flags().BoolVar(&deadLetter, "dead-letter", false, "list the consumers' inbox dead letters instead")
	cmd.Flags().StringVar(&consumer, "consumer", "", "with --dead-letter: only this consumer's")
	cmd.Flags().IntVar(&limit, "limit", 50, "at most this many rows (1..1000)")
	return cmd
}

func newEventsInspectCmd(asJSON *bool) *cobra.Command {
	var showPayload bool
	cmd := &cobra.Command{
		Use:   "inspect <event-id>",
		Short: "Show one event, every consumer's inbox row, whom acknowledgement waits for, its requeues",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			pool, err := inboxPool(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			d, err := events.Inspect(cmd.Context(), pool, args[0], showPayload)
			if err != nil {
				return eventsExit(err)
			}
			if *asJSON {
				return inboxJSON(cmd.OutOrStdout(), d)
			}
			renderDomainEvent(cmd.OutOrStdout(), d)
			return nil
		},
	}
	cmd.Flags().BoolVar(&showPayload, "show-payload", false, "also print the event's payload (may carry customer data: handle with care)")
	return cmd
}

func newEventsRequeueCmd(asJSON *bool) *cobra.Command {
	var (
		consumer, reason, actor string
		yes                     bool
	)
	cmd := &cobra.Command{
		Use:   "requeue <event-id> [--consumer C] --reason … --yes",
		Short: "Requeue exactly one dead letter with a fresh attempt budget, recording operator and reason",
		Long: `With --consumer: that consumer's inbox dead letter gets a fresh attempt budget and is due now;
an outbox row dead-lettered because its consumers gave up returns to dispatched, so catch-up lists
it again. Without --consumer: an event whose dispatch was dead-lettered (dispatch_exhausted)
returns to pending with a fresh budget. Fix the cause first (the handler, the data it needs);
never requeue in bulk. Every applied or refused requeue is recorded in event_requeues with the
operator and the reason. Without --yes, prints the change and writes nothing.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := events.RequeueRequest{EventID: args[0], Consumer: consumer, Operator: Actor(actor), Reason: reason}
			if strings.TrimSpace(reason) == "" {
				return invalidInput("requeue needs --reason (recorded with the operator)")
			}
			if consumer != "" {
				if err := events.ValidateConsumer(consumer, []string{"Any.v1"}); err != nil {
					return eventsExit(err)
				}
			}
			pool, err := inboxPool(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			plan, err := events.Requeue(cmd.Context(), pool, nil, req, yes)
			if err != nil {
				return eventsExit(err)
			}
			out := cmd.OutOrStdout()
			if *asJSON {
				return inboxJSON(out, map[string]any{"dry_run": !yes, "operator": req.Operator, "reason": req.Reason, "requeue": plan})
			}
			if !yes {
				fmt.Fprintf(out, "dry run: would requeue event %s%s as %q with reason %q:\n", plan.EventID, consumerSuffix(plan.Consumer), req.Operator, req.Reason)
				for _, c := range plan.Changes {
					fmt.Fprintf(out, "  %s\n", c)
				}
				fmt.Fprintln(out, "run again with --yes to apply")
				return nil
			}
			fmt.Fprintf(out, "requeued %s%s by %s:\n", plan.EventID, consumerSuffix(plan.Consumer), req.Operator)
			for _, c := range plan.Changes {
				fmt.Fprintf(out, "  %s\n", c)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&consumer, "consumer", "", "the consumer whose inbox dead letter to requeue (empty: a dispatch dead letter)")
	cmd.Flags().StringVar(&reason, "reason", "", "why this event is requeued (required; recorded)")
	cmd.Flags().StringVar(&actor, "actor", "", "who is acting (default $AURORA_ACTOR, else the OS user)")
	cmd.Flags().BoolVar(&yes, "yes", false, "apply; without it nothing is written")
	return cmd
}

func newEventsCleanupStuckCmd(asJSON *bool) *cobra.Command {
	var yes bool
	cmd := &cobra.Command{
		Use:   "cleanup-stuck [--yes]",
		Short: "Acknowledge every dispatched event that each registered consumer of its type already processed",
		Long: `A dispatched event whose inbox rows are processed for every consumer registered for its type
will never be acknowledged by a consumer again, and every catch-up pass would list it (seed 004's
stuck historical events). This lists exactly those events; with --yes it moves exactly those to
acknowledged, in one transaction. An event with no registered consumer, or one consumer short of
processed, is left alone. Without --yes nothing is written.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pool, err := inboxPool(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			found, err := events.CleanupStuck(cmd.Context(), pool, nil, yes)
			if err != nil {
				return eventsExit(err)
			}
			if found == nil {
				found = []events.StuckEvent{}
			}
			out := cmd.OutOrStdout()
			if *asJSON {
				acknowledged := 0
				if yes {
					acknowledged = len(found)
				}
				return inboxJSON(out, map[string]any{"dry_run": !yes, "stuck": found, "acknowledged": acknowledged})
			}
			w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "EVENT ID\tTYPE\tDISPATCHED AT\tPROCESSED BY")
			for _, e := range found {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", e.ID, e.Type, inboxTime(e.DispatchedAt), strings.Join(e.ProcessedBy, ","))
			}
			if err := w.Flush(); err != nil {
				return err
			}
			switch {
			case len(found) == 0:
				fmt.Fprintln(out, "no stuck events")
			case yes:
				fmt.Fprintf(out, "acknowledged %d events (dispatched → acknowledged)\n", len(found))
			default:
				fmt.Fprintf(out, "dry run: would acknowledge %d events (dispatched → acknowledged); run again with --yes to apply\n", len(found))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&yes, "yes", false, "apply; without it nothing is written")
	return cmd
}

// eventsExit maps shared/events errors to exit codes.
func eventsExit(err error) error {
	switch {
	case errors.Is(err, events.ErrNotFound):
		return &ExitError{Code: ExitNotFound, Msg: err.Error(), Err: err}
	case errors.Is(err, events.ErrNotDeadLettered):
		return &ExitError{Code: ExitStateMismatch, Msg: err.Error() + "; only a dead letter can be requeued", Err: err}
	case errors.Is(err, events.ErrInvalidEvent), errors.Is(err, events.ErrInvalidRequest):
		return &ExitError{Code: ExitInvalidInput, Msg: err.Error(), Err: err}
	default:
		return err
	}
}

func consumerSuffix(c string) string {
	if c == "" {
		return ""
	}
	return " for consumer " + c
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func renderDomainEvent(w io.Writer, d events.Detail) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "event_id\t%s\n", d.ID)
	fmt.Fprintf(tw, "type\t%s\n", d.Type)
	fmt.Fprintf(tw, "aggregate_id\t%s\n", d.AggregateID)
	fmt.Fprintf(tw, "status\t%s\n", d.Status)
	fmt.Fprintf(tw, "dispatch_attempts\t%d\n", d.Attempts)
	fmt.Fprintf(tw, "last_reason\t%s\n", orDash(d.LastReason))
	fmt.Fprintf(tw, "last_error\t%s\n", orDash(d.LastError))
	fmt.Fprintf(tw, "created_at\t%s\n", d.CreatedAt.UTC().Format(time.RFC3339))
	fmt.Fprintf(tw, "dispatched_at\t%s\n", inboxTime(d.DispatchedAt))
	fmt.Fprintf(tw, "acknowledged_at\t%s\n", inboxTime(d.AcknowledgedAt))
	fmt.Fprintf(tw, "dead_lettered_at\t%s\n", inboxTime(d.DeadLetteredAt))
	waiting := "-"
	if len(d.Waiting) > 0 {
		waiting = strings.Join(d.Waiting, ",")
	}
	fmt.Fprintf(tw, "waiting_for\t%s\n", waiting)
	for _, i := range d.Inbox {
		dead := ""
		if i.DeadLetteredAt != nil {
			dead = fmt.Sprintf(", dead-lettered %s (%s)", inboxTime(i.DeadLetteredAt), orDash(i.DeadLetterReason))
		}
		fmt.Fprintf(tw, "inbox %s\t%s, attempts %d, duplicates %d, processed %s%s\n", i.Consumer, i.Status, i.Attempts,
			i.DuplicateDeliveries, inboxTime(i.ProcessedAt), dead)
		if i.LastError != "" {
			fmt.Fprintf(tw, "  last_error\t%s\n", i.LastError)
		}
	}
	for _, r := range d.Requeues {
		fmt.Fprintf(tw, "requeue\t%s by %s (%s): %s%s\n", r.RequestedAt.UTC().Format(time.RFC3339), r.Operator, r.Outcome, r.Reason,
			consumerSuffix(r.Consumer))
	}
	_ = tw.Flush()
	if d.Payload != nil {
		fmt.Fprintf(w, "payload:\n%s\n", d.Payload)
	}
}
