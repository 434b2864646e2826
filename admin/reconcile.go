package admin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/aurora-billing/aurora/reconciler"
	"github.com/aurora-billing/aurora/shared/config"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
)

// newReconcileCmd is `auroractl reconcile`: the operator's side of seed
// 000, "Reconciliation". Read-only unless --yes.
func newReconcileCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "reconcile",
		Short: "Check the ledger, reconcile with Stripe, and resolve reconciliation items with evidence (read-only unless --yes)",
		Long: `Two questions, two commands (seed 000):

  local     the local check: ledger positions that claim to have reported more than their
            counter. No network, writes nothing. Blind to under-reporting, asynchronous
            rejections and invoices.
  run       one provider reconciliation (summaries, error reports, invoices). Without --yes
            it compares and prints what it would record and confirm, and writes nothing.

Then the differences:

  list      reconciliation items (open by default), oldest first
  inspect   one item, and every resolve call on it
  resolve   record that you looked at a difference and what you did about it. It changes
            nothing else: no counter, no outbox item, no credit. Dry run without --yes.`,
	}
	cmd.PersistentFlags().BoolVar(&asJSON, "json", false, "print JSON on stdout")
	cmd.AddCommand(newReconcileLocalCmd(&asJSON), newReconcileRunCmd(&asJSON), newReconcileListCmd(&asJSON),
		newReconcileInspectCmd(&asJSON), newReconcileResolveCmd(&asJSON))
	return cmd
}

// reconcileDB opens AURORA_DATABASE_URL and runs fn.
func reconcileDB(ctx context.Context, fn func(*pgxpool.Pool) error) error {
	dbURL, err := sessionURL()
	if err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return &ExitError{Code: ExitInvalidInput, Msg: "AURORA_DATABASE_URL is not a usable postgres URL: " + recoveryRedactedErr(err, dbURL), Err: err}
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		return &ExitError{Code: ExitFailure, Msg: "cannot reach the database at " + recoveryRedactURL(dbURL) + "; check AURORA_DATABASE_URL and that Postgres is up", Err: err}
	}
	return fn(pool)
}

func newReconcileLocalCmd(asJSON *bool) *cobra.Command {
	return &cobra.Command{
		Use:   "local",
		Short: "The local check: over-reporting in the ledger (no network, writes nothing)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return reconcileDB(cmd.Context(), func(pool *pgxpool.Pool) error {
				rep, err := reconciler.Local(cmd.Context(), pool)
				if err != nil {
					return err
				}
				if *asJSON {
					return recoveryJSON(cmd.OutOrStdout(), rep)
				}
				return renderLocal(cmd.OutOrStdout(), rep)
			})
		},
	}
}

func renderLocal(w io.Writer, rep reconciler.LocalReport) error {
	fmt.Fprintf(w, "local drift: %d   open reconciliation items: %d\n", len(rep.LocalDrift), rep.ItemsOpen)
	if len(rep.LocalDrift) > 0 {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  RULE\tTENANT\tFEATURE\tPERIOD\tSUBJECT\tREPORTED\tCOUNTER\tITEMS")
		for _, d := range rep.LocalDrift {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%d\t%d\t%v\n", d.Rule, d.Tenant, d.Feature, recoveryTS(d.PeriodStart), d.Subject, d.Reported, d.Counter, d.ItemIDs)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	fmt.Fprintln(w, "blind spots (ask the provider: auroractl reconcile run):")
	for _, b := range rep.BlindSpots {
		fmt.Fprintln(w, "  - "+b)
	}
	return nil
}

func newReconcileRunCmd(asJSON *bool) *cobra.Command {
	var yes bool
	cmd := &cobra.Command{
		Use:   "run",
		Short: "One provider reconciliation; without --yes it writes nothing and prints what it would record",
		Long: `Compare the ledger with Stripe's meter event summaries, meter error reports and
finalized invoices, with the reconciler service's configuration (AURORA_RECONCILER_*,
AURORA_STRIPE_API_KEY, AURORA_STRIPE_API_BASE, AURORA_STRIPE_ACCOUNT). Without --yes it
records nothing, confirms nothing and fetches no new error report.`,
		Example: `  auroractl reconcile run            # what a run would record
  auroractl reconcile run --yes --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var cfg reconciler.Config
			if err := config.Load(&cfg); err != nil {
				return &ExitError{Code: ExitInvalidInput, Msg: err.Error(), Err: err}
			}
			return reconcileDB(cmd.Context(), func(pool *pgxpool.Pool) error {
				provider, err := reconciler.NewStripeProvider(cfg.Stripe, cfg.RequestsPerSecond, 30*time.Second)
				if err != nil {
					return &ExitError{Code: ExitInvalidInput, Msg: err.Error(), Err: err}
				}
				opts := cfg.Options()
				opts.DryRun = !yes
				opts.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
				rep, err := reconciler.New(pool, provider, opts).Run(cmd.Context())
				if err != nil {
					return err
				}
				if *asJSON {
					return recoveryJSON(cmd.OutOrStdout(), rep)
				}
				return renderRun(cmd.OutOrStdout(), rep)
			})
		},
	}
	cmd.Flags().BoolVar(&yes, "yes", false, "record the findings and confirmations; without it nothing is written")
	return cmd
}

func renderRun(w io.Writer, rep reconciler.RunReport) error {
	if rep.DryRun {
		fmt.Fprintln(w, "dry run: nothing recorded (add --yes to record)")
	} else {
		fmt.Fprintf(w, "run %d recorded\n", rep.RunID)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "  now\t%s\n  settled before\t%s\n", recoveryTS(rep.Now), recoveryTS(rep.SettledBefore))
	fmt.Fprintf(tw, "  windows compared\t%d (matched %d)\n  windows unsettled\t%d\n", rep.WindowsCompared, rep.WindowsMatched, rep.WindowsUnsettled)
	fmt.Fprintf(tw, "  items confirmed\t%d\n  findings\t%d new, %d changed, %d unchanged\n", rep.ItemsConfirmed, rep.FindingsNew, rep.FindingsUpdated, rep.FindingsSame)
	for _, k := range reconciler.Kinds {
		if n := rep.Findings[k]; n > 0 {
			fmt.Fprintf(tw, "    %s\t%d\n", k, n)
		}
	}
	fmt.Fprintf(tw, "  error reports\t%d fetched, %d not fetched (dry run)\n  open items\t%d\n", rep.ReportsFetched, rep.ReportsPending, rep.ItemsOpen)
	return tw.Flush()
}

func newReconcileListCmd(asJSON *bool) *cobra.Command {
	var state string
	var limit int
	cmd := &cobra.Command{
		Use:     "list",
		Short:   "List reconciliation items (open by default), oldest first",
		Example: "  auroractl reconcile list --state open --limit 100 --json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit < 1 || limit > reconciler.MaxLimit {
				return invalidInput("--limit %d outside 1..%d", limit, reconciler.MaxLimit)
			}
			if state != string(reconciler.StateOpen) && state != string(reconciler.StateResolved) {
				return invalidInput("--state %q is not open or resolved", state)
			}
			return reconcileDB(cmd.Context(), func(pool *pgxpool.Pool) error {
				items, err := reconciler.ListItems(cmd.Context(), pool, reconciler.State(state), limit)
				if err != nil {
					return err
				}
				if *asJSON {
					return recoveryJSON(cmd.OutOrStdout(), map[string]any{"state": state, "items": items})
				}
				return renderReconcileList(cmd.OutOrStdout(), state, items)
			})
		},
	}
	cmd.Flags().StringVar(&state, "state", string(reconciler.StateOpen), "open|resolved")
	cmd.Flags().IntVar(&limit, "limit", reconciler.DefaultLimit, fmt.Sprintf("at most this many items (1..%d)", reconciler.MaxLimit))
	return cmd
}

func qty(f *float64) string {
	if f == nil {
		return "-"
	}
	return strconv.FormatFloat(*f, 'f', -1, 64)
}

func tsPtr(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return recoveryTS(*t)
}

func renderReconcileList(w io.Writer, state string, items []reconciler.Item) error {
	fmt.Fprintf(w, "%d %s reconciliation items\n", len(items), state)
	if len(items) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tKIND\tTENANT\tFEATURE\tPERIOD\tEXPECTED\tOBSERVED\tITEMS\tFIRST SEEN")
	for _, it := range items {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", it.ID, it.Kind, it.Tenant, it.Feature, tsPtr(it.PeriodStart),
			qty(it.Expected), qty(it.Observed), len(it.ItemIDs), recoveryTS(it.FirstSeenAt))
	}
	return tw.Flush()
}

func reconcileParseID(arg string) (int64, error) {
	id, err := strconv.ParseInt(arg, 10, 64)
	if err != nil || id <= 0 {
		return 0, invalidInput("reconciliation item id %q is not a positive integer; take it from `auroractl reconcile list`", arg)
	}
	return id, nil
}

// reconcileInspectView is one item and the resolve calls on it.
type reconcileInspectView struct {
	Item    reconciler.Item       `json:"item"`
	Actions []reconcileActionView `json:"actions"`
}

type reconcileActionView struct {
	ID        int64     `json:"id"`
	Actor     string    `json:"actor"`
	Reason    string    `json:"resolution"`
	Evidence  string    `json:"evidence"`
	Applied   bool      `json:"applied"`
	Refusal   *string   `json:"refusal"`
	CreatedAt time.Time `json:"created_at"`
}

func reconcileActions(ctx context.Context, pool *pgxpool.Pool, id int64) ([]reconcileActionView, error) {
	rows, err := pool.Query(ctx, `SELECT id, actor, reason, evidence, applied, refusal, created_at FROM recovery_actions
		WHERE action = $1 AND (subject->>'reconciliation_item_id')::bigint = $2 ORDER BY id`, reconciler.ActionResolve, id)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []reconcileActionView{}
	for rows.Next() {
		var a reconcileActionView
		if err := rows.Scan(&a.ID, &a.Actor, &a.Reason, &a.Evidence, &a.Applied, &a.Refusal, &a.CreatedAt); err != nil {
			return nil, err
		}
		a.CreatedAt = a.CreatedAt.UTC()
		out = append(out, a)
	}
	return out, rows.Err()
}

func newReconcileInspectCmd(asJSON *bool) *cobra.Command {
	return &cobra.Command{
		Use:   "inspect <id>",
		Short: "Show one reconciliation item, the outbox items it names and every resolve call on it",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := reconcileParseID(args[0])
			if err != nil {
				return err
			}
			return reconcileDB(cmd.Context(), func(pool *pgxpool.Pool) error {
				it, err := reconciler.GetItem(cmd.Context(), pool, id)
				if err != nil {
					return reconcileExit(err, id, 0)
				}
				acts, err := reconcileActions(cmd.Context(), pool, id)
				if err != nil {
					return err
				}
				if *asJSON {
					return recoveryJSON(cmd.OutOrStdout(), reconcileInspectView{Item: it, Actions: acts})
				}
				return renderReconcileItem(cmd.OutOrStdout(), it, acts)
			})
		},
	}
}

func renderReconcileItem(w io.Writer, it reconciler.Item, acts []reconcileActionView) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "reconciliation item %d\n", it.ID)
	fmt.Fprintf(tw, "  kind\t%s\n  state\t%s\n  tenant\t%s\n  feature\t%s\n  account\t%s\n  meter\t%s\n", it.Kind, it.State, it.Tenant, it.Feature, it.Account, it.MeterID)
	fmt.Fprintf(tw, "  period\t%s .. %s\n  expected\t%s\n  observed\t%s\n", tsPtr(it.PeriodStart), tsPtr(it.PeriodEnd), qty(it.Expected), qty(it.Observed))
	fmt.Fprintf(tw, "  detail\t%s\n  outbox items\t%v (auroractl recovery inspect <id>)\n", it.Detail, it.ItemIDs)
	fmt.Fprintf(tw, "  first seen\t%s\n  last seen\t%s\n", recoveryTS(it.FirstSeenAt), recoveryTS(it.LastSeenAt))
	if it.State == reconciler.StateResolved {
		fmt.Fprintf(tw, "  resolved\t%s by %s: %s\n", tsPtr(it.ResolvedAt), recoveryDeref(it.ResolvedBy), recoveryDeref(it.Resolution))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "resolve calls (%d)\n", len(acts))
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, a := range acts {
		outcome := "applied"
		if !a.Applied {
			outcome = "refused " + recoveryDeref(a.Refusal)
		}
		fmt.Fprintf(tw, "  #%d\t%s\t%s\t%s\t%q\t%q\n", a.ID, recoveryTS(a.CreatedAt), a.Actor, outcome, a.Reason, a.Evidence)
	}
	return tw.Flush()
}

func newReconcileResolveCmd(asJSON *bool) *cobra.Command {
	var resolution, evidence, actor string
	var yes bool
	cmd := &cobra.Command{
		Use:   "resolve <id>",
		Short: "Record what you did about a difference (changes nothing else; dry run without --yes)",
		Example: `  auroractl reconcile resolve 7 --resolution "credited manually, see invoice in_123" \
    --evidence "credit note cn_456" --actor liam --yes`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := reconcileParseID(args[0])
			if err != nil {
				return err
			}
			in := reconciler.ResolveInput{Resolution: resolution, Evidence: evidence, Actor: Actor(actor)}
			return reconcileDB(cmd.Context(), func(pool *pgxpool.Pool) error {
				out := cmd.OutOrStdout()
				if !yes {
					res, err := reconciler.PreviewResolve(cmd.Context(), pool, id, in)
					if err != nil {
						return reconcileExit(err, id, 0)
					}
					apply := strings.Join([]string{"auroractl", "reconcile", "resolve", strconv.FormatInt(id, 10),
						"--resolution", recoveryShellQuote(resolution), "--evidence", recoveryShellQuote(evidence),
						"--actor", recoveryShellQuote(in.Actor), "--yes"}, " ")
					if *asJSON {
						return recoveryJSON(out, map[string]any{"dry_run": true, "item": res.Item, "change": res.Change, "evidence": evidence, "apply_command": apply})
					}
					fmt.Fprintf(out, "dry run: nothing written\nwould resolve item %d (%s, open) as %q by %s\nit changes nothing else: no counter, no outbox item, no credit\napply with:\n  %s\n",
						id, res.Item.Kind, resolution, in.Actor, apply)
					return nil
				}
				res, err := reconciler.Resolve(cmd.Context(), pool, id, in, nil)
				if err != nil {
					if *asJSON && res.ActionID != 0 {
						_ = recoveryJSON(out, map[string]any{"applied": false, "refusal": reconciler.RefusalOf(err), "action_id": res.ActionID, "item": res.Item})
					}
					return reconcileExit(err, id, res.ActionID)
				}
				if *asJSON {
					return recoveryJSON(out, map[string]any{"applied": true, "action_id": res.ActionID, "item": res.Item, "change": res.Change})
				}
				fmt.Fprintf(out, "resolved item %d as %q by %s (recorded as action #%d); nothing else changed\n", id, resolution, in.Actor, res.ActionID)
				return nil
			})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&resolution, "resolution", "", "what you did about the difference (required, non-blank)")
	fl.StringVar(&evidence, "evidence", "", "what you looked at: a credit note, an invoice, a search and its result")
	fl.StringVar(&actor, "actor", "", "who is resolving (default $AURORA_ACTOR, else the OS user)")
	fl.BoolVar(&yes, "yes", false, "apply; without it nothing is written")
	return cmd
}

// reconcileExit maps a reconciler error to an exit code and a one-line
// message that says what to do.
func reconcileExit(err error, id, actionID int64) error {
	recorded := ""
	if actionID != 0 {
		recorded = fmt.Sprintf(" (refusal recorded as action #%d)", actionID)
	}
	var ar *reconciler.AlreadyResolvedError
	switch {
	case errors.Is(err, reconciler.ErrNotFound):
		return &ExitError{Code: ExitNotFound, Err: err, Msg: fmt.Sprintf("reconciliation item %d not found; find ids with `auroractl reconcile list`", id)}
	case errors.Is(err, reconciler.ErrInvalidResolution):
		return &ExitError{Code: ExitInvalidInput, Err: err, Msg: "invalid_resolution: --resolution is blank; say what you did about the difference" + recorded}
	case errors.Is(err, reconciler.ErrInvalidActor):
		return &ExitError{Code: ExitInvalidInput, Err: err, Msg: "invalid_actor: no actor; pass --actor or set AURORA_ACTOR" + recorded}
	case errors.As(err, &ar):
		return &ExitError{Code: ExitRefused, Err: err, Msg: fmt.Sprintf("already_resolved: item %d was resolved by %s (%q)%s", id, ar.ResolvedBy, ar.Resolution, recorded)}
	}
	return err
}

// reconcileEvidence is what the reconciler knows of outbox item id, for
// `auroractl recovery inspect`; nil when it cannot be read (an older
// schema), so inspect still shows the item.
func reconcileEvidence(ctx context.Context, id int64) *reconciler.ItemEvidence {
	var ev *reconciler.ItemEvidence
	_ = reconcileDB(ctx, func(pool *pgxpool.Pool) error {
		e, err := reconciler.Evidence(ctx, pool, id)
		if err == nil {
			ev = &e
		}
		return err
	})
	return ev
}

func renderReconcileEvidence(w io.Writer, ev *reconciler.ItemEvidence) {
	if ev == nil {
		fmt.Fprintln(w, "reconciliation: unknown (the reconciler's tables cannot be read)")
		return
	}
	fmt.Fprintf(w, "reconciliation: %s\n", ev.Status)
	if ev.Window != nil {
		fmt.Fprintf(w, "  window [%s, %s): committed %s, Stripe %s, settled %t, matched %t, compared %s\n",
			recoveryTS(ev.Window.Start), recoveryTS(ev.Window.End), strconv.FormatFloat(ev.Window.Committed, 'f', -1, 64), qty(ev.Window.Observed),
			ev.Window.Settled, ev.Window.Matched, recoveryTS(ev.Window.ComparedAt))
	}
	for _, it := range ev.Items {
		fmt.Fprintf(w, "  reconciliation item %d: %s (%s)\n", it.ID, it.Kind, it.State)
	}
}
