package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/aurora-billing/aurora/reconciler"
	"github.com/aurora-billing/aurora/recovery"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
)

// newRecoveryCmd is `auroractl recovery`: the operator's side of seed 000,
// "Quarantine" and "An uncertain item, and the person who resolves it".
// Read-only unless --yes.
func newRecoveryCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "recovery",
		Short: "Find, inspect and resolve uncertain and quarantined outbox items (read-only unless --yes)",
		Long: `Resolve what software must not decide, with evidence (seed 000).

  list          uncertain (or quarantined) items, oldest first
  inspect       one item: its attempts, its recovery actions, the identifier to search for at Stripe
  acknowledge   uncertain -> accepted: you found it in Stripe's records (never "confirmed")
  abandon       uncertain -> rejected: you found no trace of it; the subject restages under a NEW
                identity and is SENT AGAIN. A wrong abandonment double-bills. When unsure, leave it.
  requeue       quarantined -> pending, after you fixed the cause
  restage       quarantined -> rejected + a new item for the feature's CURRENT mapping version
                under the SAME identifier (after provision meter remapped the feature)
  actions       every recovery call on one item, applied or refused

Write commands are dry runs without --yes: they print the row, the change and the
expected-state map they would send, and write nothing. With --yes the expected
state is compared with the row under a lock; a row that moved since is refused
(exit 4) and the refusal is recorded. Pin the screen you decided on with
--expect-state, --expect-lease-token, --expect-subject-ref (the dry run prints
the exact command). There is no force option.`,
	}
	cmd.PersistentFlags().BoolVar(&asJSON, "json", false, "print JSON on stdout")
	cmd.AddCommand(
		newRecoveryListCmd(&asJSON),
		newRecoveryInspectCmd(&asJSON),
		newRecoveryActionsCmd(&asJSON),
		newRecoveryWriteCmd(&asJSON, recovery.KindAcknowledge),
		newRecoveryWriteCmd(&asJSON, recovery.KindAbandon),
		newRecoveryWriteCmd(&asJSON, recovery.KindRequeue),
		newRecoveryRestageCmd(&asJSON),
	)
	return cmd
}

// recoveryService opens AURORA_DATABASE_URL and runs fn with a recovery service
// on the database clock.
func recoveryService(ctx context.Context, fn func(*recovery.Service) error) error {
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
	return fn(recovery.New(pool, recovery.Config{}))
}

func recoveryRedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "AURORA_DATABASE_URL"
	}
	return u.Redacted()
}

func recoveryRedactedErr(err error, raw string) string {
	msg := err.Error()
	if u, perr := url.Parse(raw); perr == nil && u.User != nil {
		if p, ok := u.User.Password(); ok && p != "" {
			msg = strings.ReplaceAll(msg, p, "xxxxx")
		}
	}
	return msg
}

func recoveryParseID(arg string) (int64, error) {
	id, err := strconv.ParseInt(arg, 10, 64)
	if err != nil || id <= 0 {
		return 0, invalidInput("item id %q is not a positive integer; take it from `auroractl recovery list`", arg)
	}
	return id, nil
}

func recoveryJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func newRecoveryListCmd(asJSON *bool) *cobra.Command {
	var state, reason string
	var olderThan time.Duration
	var limit int
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List uncertain (default) or quarantined items, oldest first",
		Example: `  auroractl recovery list --state uncertain --older-than 24h
  auroractl recovery list --state quarantined --reason feature_unmapped --limit 200 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit < 1 || limit > recovery.MaxLimit {
				return invalidInput("--limit %d outside 1..%d", limit, recovery.MaxLimit)
			}
			p := recovery.ListParams{State: outbox.State(state), OlderThan: olderThan, Reason: outbox.Reason(reason), Limit: limit}
			return recoveryService(cmd.Context(), func(svc *recovery.Service) error {
				rows, err := svc.List(cmd.Context(), p)
				if err != nil {
					return recoveryExit(err, 0, nil)
				}
				if *asJSON {
					items := make([]recoveryItemView, len(rows))
					for i, r := range rows {
						items[i] = recoveryItemOf(r)
					}
					return recoveryJSON(cmd.OutOrStdout(), map[string]any{"state": state, "older_than_seconds": olderThan.Seconds(), "items": items})
				}
				return renderRecoveryList(cmd.OutOrStdout(), state, olderThan, rows)
			})
		},
	}
	cmd.Flags().StringVar(&state, "state", string(outbox.StateUncertain), "uncertain|quarantined")
	cmd.Flags().DurationVar(&olderThan, "older-than", 0, "only items in the state for at least this long, e.g. 24h (Go duration)")
	cmd.Flags().StringVar(&reason, "reason", "", "quarantined only: filter by quarantine reason, e.g. feature_unmapped")
	cmd.Flags().IntVar(&limit, "limit", recovery.DefaultLimit, fmt.Sprintf("at most this many items (1..%d)", recovery.MaxLimit))
	return cmd
}

func newRecoveryInspectCmd(asJSON *bool) *cobra.Command {
	return &cobra.Command{
		Use:   "inspect <id>",
		Short: "Show one item, its attempts, its recovery actions and the identifier to search for at Stripe",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := recoveryParseID(args[0])
			if err != nil {
				return err
			}
			return recoveryService(cmd.Context(), func(svc *recovery.Service) error {
				ins, err := svc.Inspect(cmd.Context(), id)
				if err != nil {
					return recoveryExit(err, id, nil)
				}
				// what the reconciler knows: is its window settled, did it match
				ev := reconcileEvidence(cmd.Context(), id)
				if *asJSON {
					return recoveryJSON(cmd.OutOrStdout(), struct {
						recoveryInspectView
						Reconciliation *reconciler.ItemEvidence `json:"reconciliation"`
					}{recoveryInspectOf(ins), ev})
				}
				if err := renderRecoveryInspect(cmd.OutOrStdout(), ins); err != nil {
					return err
				}
				renderReconcileEvidence(cmd.OutOrStdout(), ev)
				return nil
			})
		},
	}
}

func newRecoveryActionsCmd(asJSON *bool) *cobra.Command {
	return &cobra.Command{
		Use:   "actions <id>",
		Short: "List every recovery call on one item, applied or refused, oldest first",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := recoveryParseID(args[0])
			if err != nil {
				return err
			}
			return recoveryService(cmd.Context(), func(svc *recovery.Service) error {
				acts, err := svc.Actions(cmd.Context(), id)
				if err != nil {
					return recoveryExit(err, id, nil)
				}
				if *asJSON {
					return recoveryJSON(cmd.OutOrStdout(), map[string]any{"item_id": id, "actions": acts})
				}
				return renderRecoveryActions(cmd.OutOrStdout(), acts)
			})
		},
	}
}

// recoveryWriteFlags are the flags of acknowledge, abandon and requeue.
type recoveryWriteFlags struct {
	kind              recovery.Kind
	reason, evidence  string
	providerRef       string
	actor             string
	yes               bool
	expectState       string
	expectLeaseToken  int64
	expectSubjectRef  string
	expectProviderRef string
}

var recoveryWriteDocs = map[recovery.Kind]struct{ short, example string }{
	recovery.KindAcknowledge: {
		"uncertain -> accepted: you found the item in Stripe's records (dry run without --yes)",
		`  auroractl recovery acknowledge 42 --provider-ref req_TEST \
    --reason "verified in the Stripe dashboard" \
    --evidence "request log req_TEST at 2026-09-15T09:12Z shows a 200 for this identifier" --yes`,
	},
	recovery.KindAbandon: {
		"uncertain -> rejected: no trace at Stripe; the subject restages under a NEW identity and is sent again (dry run without --yes)",
		`  auroractl recovery abandon 42 \
    --reason "no meter event for this identifier in the request logs" \
    --evidence "searched 2026-09-15 09:00Z to 10:00Z, 0 results" --yes`,
	},
	recovery.KindRequeue: {
		"quarantined -> pending after the cause was fixed; refused when the mapping version moved (dry run without --yes)",
		`  auroractl recovery requeue 42 --reason "linked the tenant's Stripe customer" --yes`,
	},
}

func newRecoveryWriteCmd(asJSON *bool, kind recovery.Kind) *cobra.Command {
	f := &recoveryWriteFlags{kind: kind}
	cmd := &cobra.Command{
		Use:     string(kind) + " <id>",
		Short:   recoveryWriteDocs[kind].short,
		Example: recoveryWriteDocs[kind].example,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := recoveryParseID(args[0])
			if err != nil {
				return err
			}
			return recoveryService(cmd.Context(), func(svc *recovery.Service) error {
				return runRecoveryWrite(cmd, svc, f, id, *asJSON)
			})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.reason, "reason", "", "why (required, non-blank)")
	if kind == recovery.KindRequeue {
		fl.StringVar(&f.evidence, "evidence", "", "what shows the cause is fixed (optional)")
	} else {
		fl.StringVar(&f.evidence, "evidence", "", "what you found in Stripe's records (required, non-blank)")
	}
	if kind == recovery.KindAcknowledge {
		fl.StringVar(&f.providerRef, "provider-ref", "", "Stripe's reference you found (e.g. request id req_…), stored on the item")
	}
	fl.StringVar(&f.actor, "actor", "", "who is acting (default $AURORA_ACTOR, else the OS user)")
	fl.BoolVar(&f.yes, "yes", false, "apply; without it nothing is written")
	fl.StringVar(&f.expectState, "expect-state", "", "pin: the state you saw (default: a fresh read)")
	fl.Int64Var(&f.expectLeaseToken, "expect-lease-token", 0, "pin: the lease token you saw (default: a fresh read)")
	fl.StringVar(&f.expectSubjectRef, "expect-subject-ref", "", "pin: the subject ref you saw (default: a fresh read)")
	fl.StringVar(&f.expectProviderRef, "expect-provider-ref", "", "pin: the provider ref you saw (default: a fresh read, when the row has one)")
	return cmd
}

// expected builds the expected-state map: a fresh read of the row, with
// every --expect-* flag given overriding its field.
func (f *recoveryWriteFlags) expected(cmd *cobra.Command, row outbox.Row) recovery.Expected {
	e := recovery.ExpectedOf(row)
	fl := cmd.Flags()
	if fl.Changed("expect-state") {
		e.State = outbox.State(f.expectState)
	}
	if fl.Changed("expect-lease-token") {
		e.LeaseToken = f.expectLeaseToken
	}
	if fl.Changed("expect-subject-ref") {
		e.SubjectRef = f.expectSubjectRef
	}
	if fl.Changed("expect-provider-ref") {
		p := f.expectProviderRef
		e.ProviderRef = &p
	}
	return e
}

func runRecoveryWrite(cmd *cobra.Command, svc *recovery.Service, f *recoveryWriteFlags, id int64, asJSON bool) error {
	ctx := cmd.Context()
	row, err := svc.Get(ctx, id)
	if err != nil {
		return recoveryExit(err, id, nil)
	}
	expected := f.expected(cmd, row)
	actor := Actor(f.actor)
	var (
		preview recovery.Preview
		res     recovery.Result
	)
	switch f.kind {
	case recovery.KindAcknowledge:
		in := recovery.AcknowledgeInput{Expected: expected, ProviderRef: f.providerRef, Reason: f.reason, Evidence: f.evidence, Actor: actor}
		if !f.yes {
			preview, err = svc.PreviewAcknowledge(ctx, id, in)
		} else {
			res, err = svc.Acknowledge(ctx, id, in)
		}
	case recovery.KindAbandon:
		in := recovery.AbandonInput{Expected: expected, Reason: f.reason, Evidence: f.evidence, Actor: actor}
		if !f.yes {
			preview, err = svc.PreviewAbandon(ctx, id, in)
		} else {
			res, err = svc.Abandon(ctx, id, in)
		}
	case recovery.KindRequeue:
		in := recovery.RequeueInput{Expected: expected, Reason: f.reason, Evidence: f.evidence, Actor: actor}
		if !f.yes {
			preview, err = svc.PreviewRequeue(ctx, id, in)
		} else {
			res, err = svc.Requeue(ctx, id, in)
		}
	default:
		return fmt.Errorf("unknown recovery action %q", f.kind)
	}
	out := cmd.OutOrStdout()
	if !f.yes {
		if err != nil {
			// A dry run records nothing, applied or refused.
			if asJSON && recovery.RefusalOf(err) != "" {
				_ = recoveryJSON(out, recoveryRefusalOf(err, f.kind, id, true, preview.Item, nil))
			}
			return recoveryExit(err, id, nil)
		}
		cmdline := recoveryApplyCommand(f, id, expected)
		if asJSON {
			return recoveryJSON(out, recoveryDryRunView{
				DryRun: true, Action: f.kind, Item: recoveryItemOf(preview.Item), Change: preview.Change,
				Expected: preview.Expected, Actor: actor, Reason: f.reason, Evidence: f.evidence, ApplyCommand: cmdline,
			})
		}
		return renderRecoveryDryRun(out, f.kind, preview, actor, f.reason, f.evidence, cmdline)
	}
	if err != nil {
		var act *recovery.Action
		if res.Action.ID != 0 {
			act = &res.Action
		}
		if asJSON && recovery.RefusalOf(err) != "" {
			_ = recoveryJSON(out, recoveryRefusalOf(err, f.kind, id, false, res.Item, act))
		}
		return recoveryExit(err, id, act)
	}
	if asJSON {
		v := recoveryAppliedView{Applied: true, Action: res.Action, Item: recoveryItemOf(res.Item), Change: res.Change}
		if res.Restaged != nil {
			r := recoveryItemOf(*res.Restaged)
			v.Restaged = &r
		}
		return recoveryJSON(out, v)
	}
	return renderRecoveryApplied(out, res)
}

// recoveryApplyCommand is the command that applies exactly the dry run's screen:
// every expected field pinned.
func recoveryApplyCommand(f *recoveryWriteFlags, id int64, e recovery.Expected) string {
	parts := []string{"auroractl", "recovery", string(f.kind), strconv.FormatInt(id, 10),
		"--expect-state", string(e.State), "--expect-lease-token", strconv.FormatInt(e.LeaseToken, 10),
		"--expect-subject-ref", recoveryShellQuote(e.SubjectRef)}
	if e.ProviderRef != nil {
		parts = append(parts, "--expect-provider-ref", recoveryShellQuote(*e.ProviderRef))
	}
	if f.providerRef != "" {
		parts = append(parts, "--provider-ref", recoveryShellQuote(f.providerRef))
	}
	parts = append(parts, "--reason", recoveryShellQuote(f.reason))
	if f.evidence != "" || f.kind != recovery.KindRequeue {
		parts = append(parts, "--evidence", recoveryShellQuote(f.evidence))
	}
	if f.actor != "" {
		parts = append(parts, "--actor", recoveryShellQuote(f.actor))
	}
	return strings.Join(append(parts, "--yes"), " ")
}

// recoveryShellQuote quotes s for a POSIX shell when it needs it.
func recoveryShellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.:/=@+,") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// recoveryExit maps a recovery error to an exit code and a one-line message
// that says what to do. act is the recorded refusal, when there is one.
func recoveryExit(err error, id int64, act *recovery.Action) error {
	recorded := ""
	if act != nil {
		recorded = fmt.Sprintf(" (refusal recorded as action #%d)", act.ID)
	}
	var (
		mm *recovery.ExpectedStateMismatchError
		ie *recovery.InvalidExpectedError
		mc *recovery.MappingChangedError
		sb *recovery.StillBufferedError
	)
	switch {
	case errors.Is(err, recovery.ErrNotFound):
		return &ExitError{Code: ExitNotFound, Err: err,
			Msg: fmt.Sprintf("item %d not found; find ids with `auroractl recovery list`", id)}
	case errors.As(err, &mm):
		return &ExitError{Code: ExitStateMismatch, Err: err,
			Msg: fmt.Sprintf("expected_state_mismatch: item %d moved since your screen (%s); re-read it with `auroractl recovery inspect %d` and decide again%s",
				id, recoveryMismatchDetail(mm), id, recorded)}
	case errors.Is(err, recovery.ErrInvalidReason):
		return &ExitError{Code: ExitInvalidInput, Err: err, Msg: "invalid_reason: --reason is blank; say why you are doing this" + recorded}
	case errors.Is(err, recovery.ErrInvalidEvidence):
		return &ExitError{Code: ExitInvalidInput, Err: err,
			Msg: "invalid_evidence: --evidence is blank; say what you found in Stripe's records (request id, or the search you ran and its result)" + recorded}
	case errors.Is(err, recovery.ErrInvalidActor):
		return &ExitError{Code: ExitInvalidInput, Err: err, Msg: "invalid_actor: no actor; pass --actor or set AURORA_ACTOR" + recorded}
	case errors.As(err, &ie):
		return &ExitError{Code: ExitInvalidInput, Err: err,
			Msg: fmt.Sprintf("invalid_expected: --expect-%s %s; check the item with `auroractl recovery inspect %d`%s", flagName(ie.Field), ie.Reason, id, recorded)}
	case errors.As(err, &sb):
		why := "no cutover watermark is scheduled for its feature"
		if sb.Watermark != nil {
			why = "it starts before the feature's cutover watermark " + sb.Watermark.UTC().Format(time.RFC3339)
		}
		return &ExitError{Code: ExitRefused, Err: err,
			Msg: fmt.Sprintf("still_buffered: item %d's period %s is billed by the buffered counters (%s); requeueing would bill it twice: leave it quarantined%s",
				id, sb.PeriodStart.UTC().Format(time.RFC3339), why, recorded)}
	case errors.As(err, &mc):
		return &ExitError{Code: ExitRefused, Err: err,
			Msg: fmt.Sprintf("mapping_changed: item %d was built for mapping version %d and the feature's mapping is now %d; it cannot be requeued: leave it quarantined and restage the work for the current mapping%s",
				id, mc.ItemVersion, mc.CurrentVersion, recorded)}
	case errors.Is(err, recovery.ErrInvalidQuery):
		return &ExitError{Code: ExitInvalidInput, Err: err, Msg: strings.TrimPrefix(err.Error(), "recovery: ") + " (see --help)"}
	}
	return err
}

func recoveryMismatchDetail(mm *recovery.ExpectedStateMismatchError) string {
	var parts []string
	now := recovery.Observe(mm.Current)
	for _, f := range mm.Fields {
		switch f {
		case "state":
			parts = append(parts, fmt.Sprintf("state: expected %s, now %s", mm.Expected.State, now.State))
		case "lease_token":
			parts = append(parts, fmt.Sprintf("lease_token: expected %d, now %d", mm.Expected.LeaseToken, now.LeaseToken))
		case "subject_ref":
			parts = append(parts, fmt.Sprintf("subject_ref: expected %q, now %q", mm.Expected.SubjectRef, now.SubjectRef))
		case "provider_ref":
			parts = append(parts, fmt.Sprintf("provider_ref: expected %q, now %s", recoveryDeref(mm.Expected.ProviderRef), recoveryQuotedOrNone(now.ProviderRef)))
		}
	}
	return strings.Join(parts, "; ")
}

func recoveryDeref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func recoveryQuotedOrNone(s *string) string {
	if s == nil {
		return "none"
	}
	return strconv.Quote(*s)
}
