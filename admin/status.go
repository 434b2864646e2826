package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/aurora-billing/aurora/gauge"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
)

// StatusLine is one figure of `auroractl status`: its name, its value as
// shown, whether it is zero, and (when it is not) the next command to run.
type StatusLine struct {
	Figure string  `json:"figure"`
	Value  float64 `json:"value"`
	Unit   string  `json:"unit"` // "items", "events", "attempts" or "seconds"
	Next   string  `json:"next,omitempty"`
	// Runbook names the RUNBOOK.md section (the alert) for this figure.
	Runbook string `json:"runbook,omitempty"`
}

// statusJSON is `auroractl status --json` (fields are added, never
// renamed): the figures as lines, and the whole measurement.
type statusJSON struct {
	MeasuredAt time.Time      `json:"measured_at"`
	Lines      []StatusLine   `json:"lines"`
	Snapshot   gauge.Snapshot `json:"snapshot"`
}

func newStatusCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "One screen: every figure the alerts watch, and the next command for each that is not zero",
		Long: `status measures, from AURORA_DATABASE_URL and with its clock, what the alert rules watch
(the same queries as the gauges exporter): uncertain and quarantined outbox items, the
outbox backlog age by state, the webhook inbox's pending events, dead letters and
attempts, and open reconciliation items. For each figure that is not zero it prints the
next command to run and the RUNBOOK.md section. It writes nothing. Exit 0 when measured
(whatever the figures), 1 when the database cannot be measured.`,
		Example: "  auroractl status\n  auroractl status --json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := measureStatus(cmd.Context())
			if err != nil {
				return err
			}
			lines := StatusLines(s)
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(statusJSON{MeasuredAt: s.MeasuredAt, Lines: lines, Snapshot: s})
			}
			return renderStatus(cmd.OutOrStdout(), s, lines)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON on stdout")
	return cmd
}

func measureStatus(ctx context.Context) (gauge.Snapshot, error) {
	dbURL, err := sessionURL()
	if err != nil {
		return gauge.Snapshot{}, err
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return gauge.Snapshot{}, &ExitError{Code: ExitInvalidInput, Msg: "AURORA_DATABASE_URL is not a usable postgres URL: " + recoveryRedactedErr(err, dbURL), Err: err}
	}
	defer pool.Close()
	r, err := gauge.NewReader(pool, gauge.DefaultConfig())
	if err != nil {
		return gauge.Snapshot{}, err
	}
	s, err := r.Read(ctx)
	if err != nil {
		return gauge.Snapshot{}, &ExitError{Code: ExitFailure, Msg: "cannot measure the database at " + recoveryRedactURL(dbURL) + "; check AURORA_DATABASE_URL and that Postgres is up", Err: err}
	}
	return s, nil
}

// StatusLines turns a Snapshot into the lines of the status screen, in
// the order an operator should look: money whose fate is unknown first.
// Per-reason and per-kind lines appear only when not zero.
func StatusLines(s gauge.Snapshot) []StatusLine {
	var out []StatusLine
	add := func(figure string, v float64, unit, next, runbook string) {
		l := StatusLine{Figure: figure, Value: v, Unit: unit}
		if v != 0 {
			l.Next, l.Runbook = next, runbook
		}
		out = append(out, l)
	}
	o := s.Outbox
	add("outbox uncertain", float64(o.Items[outbox.StateUncertain]), "items",
		"auroractl recovery list --state uncertain   (then: auroractl recovery inspect <id>)", "AuroraUncertainItems")
	add("outbox uncertain, oldest", o.UncertainOldestAgeSeconds, "seconds",
		"auroractl recovery list --state uncertain --older-than 1h", "AuroraUncertainItems")
	add("outbox quarantined", float64(o.Items[outbox.StateQuarantined]), "items",
		"auroractl recovery list --state quarantined", "AuroraQuarantineGrowing")
	for _, reason := range sortedKeys(o.QuarantinedByReason) {
		if n := o.QuarantinedByReason[reason]; n != 0 {
			add("  quarantined "+reason, float64(n), "items",
				"auroractl recovery list --state quarantined --reason "+reason, "AuroraQuarantineGrowing")
		}
	}
	add("outbox pending", float64(o.Items[outbox.StatePending]), "items",
		"nats consumer info AURORA_OUTBOX aurora-deliverer   (is it being delivered?)", "AuroraOutboxBacklogOld")
	add("outbox pending, oldest staged", o.BacklogAgeSeconds[outbox.StatePending], "seconds",
		psqlOldestOpen, "AuroraOutboxBacklogOld")
	add("outbox leased", float64(o.Items[outbox.StateLeased]), "items",
		"nats consumer info AURORA_OUTBOX aurora-deliverer", "AuroraOutboxBacklogOld")
	add("outbox leased, oldest staged", o.BacklogAgeSeconds[outbox.StateLeased], "seconds",
		psqlOldestOpen, "AuroraOutboxBacklogOld")
	add("outbox accepted, oldest staged (awaiting confirmation)", o.BacklogAgeSeconds[outbox.StateAccepted], "seconds",
		"auroractl reconcile run   (dry run: what the reconciler would confirm or record)", "")
	in := s.Inbox
	add("inbox dead letters", float64(in.DeadLetterTotal()), "events",
		"auroractl inbox list --dead-letter   (then: auroractl inbox inspect <event-id>)", "AuroraInboxDeadLetters")
	for _, reason := range sortedKeys(in.DeadLetters) {
		if n := in.DeadLetters[reason]; n != 0 {
			add("  dead letters "+reason, float64(n), "events", "auroractl inbox list --dead-letter", "AuroraInboxDeadLetters")
		}
	}
	add("inbox pending", float64(in.Pending), "events", "auroractl inbox inventory", "AuroraInboxPendingOld")
	add("inbox pending, oldest received", in.OldestPendingAgeSeconds, "seconds", "auroractl inbox inventory", "AuroraInboxPendingOld")
	add("inbox highest pending attempts", float64(in.HighestPendingAttempts), "attempts", "auroractl inbox inventory", "AuroraInboxAttemptsGrowing")
	rc := s.Reconciliation
	add("reconciliation open items", float64(rc.OpenTotal()), "items",
		"auroractl reconcile list   (then: auroractl reconcile inspect <id>)", "AuroraReconciliationItemOpenTooLong")
	for _, kind := range sortedKeys(rc.OpenByKind) {
		if n := rc.OpenByKind[kind]; n != 0 {
			add("  open "+kind, float64(n), "items", "auroractl reconcile list", "AuroraReconciliationItemOpenTooLong")
		}
	}
	add("reconciliation oldest open", rc.OldestOpenAgeSeconds(), "seconds", "auroractl reconcile list", "AuroraReconciliationItemOpenTooLong")
	return out
}

// psqlOldestOpen lists the oldest items a deliverer still has to move,
// with why their last attempt failed (no payload, no customer id).
const psqlOldestOpen = `psql "$AURORA_DATABASE_URL" -c "SELECT id, state, attempts, next_attempt_at, lease_expires_at, last_error FROM outbox_items WHERE state IN ('pending','leased') ORDER BY created_at LIMIT 20"`

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func renderStatus(w io.Writer, s gauge.Snapshot, lines []StatusLine) error {
	fmt.Fprintf(w, "aurora status at %s (database clock)\n\n", s.MeasuredAt.Format(time.RFC3339))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "FIGURE\tVALUE\tNEXT")
	attention := 0
	for _, l := range lines {
		v := fmt.Sprintf("%.0f", l.Value)
		if l.Unit == "seconds" {
			v = (time.Duration(l.Value) * time.Second).String()
		} else if int64(l.Value) == int64(s.CountCap) {
			v += "+" // a capped count: at least this many
		}
		next := l.Next
		if next != "" && l.Runbook != "" {
			next += "   [RUNBOOK.md: " + l.Runbook + "]"
		}
		if l.Next != "" {
			attention++
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", l.Figure, v, next)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if attention == 0 {
		fmt.Fprintln(w, "\nnothing needs a person")
	}
	return nil
}
