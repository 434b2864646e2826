package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/aurora-billing/aurora/gauge"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
)

// StatusLine is one figure of `auroractl status`: its name, its value as
// shown, whether it needs a person, and (when it does) the next command.
type StatusLine struct {
	Figure string  `json:"figure"`
	Value  float64 `json:"value"`
	Unit   string  `json:"unit"` // "items", "events", "attempts" or "seconds"
	// Attention: the value passed its threshold (zero for what only a
	// person moves, the alert's objective for ages); only then are Next and
	// Runbook set.
	Attention bool   `json:"attention"`
	Next      string `json:"next,omitempty"`
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
		Short: "One screen: every figure the alerts watch, and the next command for each that needs a person",
		Long: `status measures, from AURORA_DATABASE_URL and with its clock, what the alert rules watch
(the same queries as the gauges exporter): uncertain and quarantined outbox items, the
outbox backlog age by state, the webhook inbox's pending events, dead letters and
attempts, open reconciliation items, and the domain events' dead letters and each
consumer's catch-up lag. For each figure that needs a person — above zero for what only a
person moves (uncertain, quarantined, dead letters, open findings), past the alert's
objective for ages — it prints the next command to run and the RUNBOOK.md section. It writes nothing.

Exit codes, for cron and scripts: 0 measured and nothing needs a person; 6 measured and at
least one figure needs a person (the screen, or --json, is printed first); 1 the database
cannot be measured.`,
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
				err = enc.Encode(statusJSON{MeasuredAt: s.MeasuredAt, Lines: lines, Snapshot: s})
			} else {
				err = renderStatus(cmd.OutOrStdout(), s, lines)
			}
			if err != nil {
				return err
			}
			return attentionError(lines)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON on stdout")
	return cmd
}

// attentionError is an ExitError with ExitAttention naming how many
// figures need a person, or nil when none does.
func attentionError(lines []StatusLine) error {
	var n int
	for _, l := range lines {
		if l.Attention {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	return &ExitError{Code: ExitAttention, Msg: fmt.Sprintf("status: %d figure(s) need a person; see the next command of each (exit %d)", n, ExitAttention)}
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

// Thresholds above which a status figure needs a person. They are the
// alert rules' objectives (deploy/prometheus/alerts.yml), so status and the
// pager agree; counts of states a person must act on (uncertain,
// quarantined, dead letters, open findings) need one above zero.
const (
	statusBacklogObjective       = 15 * 60   // pending/leased oldest, AuroraOutboxBacklogOld
	statusAcceptedObjective      = 48 * 3600 // accepted, unconfirmed: the reconciler's unconfirmed_acceptance horizon
	statusInboxPendingObjective  = 3600      // AuroraInboxPendingOld
	statusInboxAttemptsObjective = 3         // AuroraInboxAttemptsGrowing
	statusReconOpenObjective     = 24 * 3600 // AuroraReconciliationItemOpenTooLong
	statusEventLagObjective      = 5 * 60    // AuroraEventConsumerLagging
	statusEventDispatchObjective = 2 * 60    // as AuroraRelayBehind, for domain events
)

// StatusLines turns a Snapshot into the lines of the status screen, in
// the order an operator should look: money whose fate is unknown first.
// A line needs attention (Attention, with Next and Runbook) when its value
// passes its threshold: above zero for what only a person moves, above the
// alert's objective for ages and for the backlog a running pipeline always
// has. Per-reason, per-kind and per-consumer lines appear only when not zero.
func StatusLines(s gauge.Snapshot) []StatusLine {
	var out []StatusLine
	add := func(figure string, v float64, unit string, above float64, next, runbook string) {
		l := StatusLine{Figure: figure, Value: v, Unit: unit}
		if v > above {
			l.Attention, l.Next, l.Runbook = true, next, runbook
		}
		out = append(out, l)
	}
	o := s.Outbox
	add("outbox uncertain", float64(o.Items[outbox.StateUncertain]), "items", 0,
		"auroractl recovery list --state uncertain   (then: auroractl recovery inspect <id>)", "AuroraUncertainItems")
	add("outbox uncertain, oldest", o.UncertainOldestAgeSeconds, "seconds", 0,
		"auroractl recovery list --state uncertain   (oldest first)", "AuroraUncertainItems")
	add("outbox quarantined", float64(o.Items[outbox.StateQuarantined]), "items", 0,
		"auroractl recovery list --state quarantined", "AuroraQuarantineGrowing")
	for _, reason := range sortedKeys(o.QuarantinedByReason) {
		if n := o.QuarantinedByReason[reason]; n != 0 {
			add("  quarantined "+reason, float64(n), "items", 0,
				"auroractl recovery list --state quarantined --reason "+reason, "AuroraQuarantineGrowing")
		}
	}
	// A running pipeline always has some pending and leased items: their
	// counts are shown, their age decides.
	add("outbox pending", float64(o.Items[outbox.StatePending]), "items", math.Inf(1), "", "")
	add("outbox pending, oldest staged", o.BacklogAgeSeconds[outbox.StatePending], "seconds", statusBacklogObjective,
		"nats consumer info AURORA_OUTBOX aurora-deliverer   (then: "+psqlOldestOpen+")", "AuroraOutboxBacklogOld")
	add("outbox leased", float64(o.Items[outbox.StateLeased]), "items", math.Inf(1), "", "")
	add("outbox leased, oldest staged", o.BacklogAgeSeconds[outbox.StateLeased], "seconds", statusBacklogObjective,
		"nats consumer info AURORA_OUTBOX aurora-deliverer   (then: "+psqlOldestOpen+")", "AuroraOutboxBacklogOld")
	add("outbox accepted, oldest staged (awaiting confirmation)", o.BacklogAgeSeconds[outbox.StateAccepted], "seconds", statusAcceptedObjective,
		"auroractl reconcile run   (dry run: what the reconciler would confirm or record)", "AuroraReconciliationItemOpenTooLong")
	in := s.Inbox
	add("inbox dead letters", float64(in.DeadLetterTotal()), "events", 0,
		"auroractl inbox list --dead-letter   (then: auroractl inbox inspect <event-id>)", "AuroraInboxDeadLetters")
	for _, reason := range sortedKeys(in.DeadLetters) {
		if n := in.DeadLetters[reason]; n != 0 {
			add("  dead letters "+reason, float64(n), "events", 0, "auroractl inbox list --dead-letter", "AuroraInboxDeadLetters")
		}
	}
	add("inbox pending", float64(in.Pending), "events", math.Inf(1), "", "")
	add("inbox pending, oldest received", in.OldestPendingAgeSeconds, "seconds", statusInboxPendingObjective,
		"auroractl inbox inventory", "AuroraInboxPendingOld")
	add("inbox highest pending attempts", float64(in.HighestPendingAttempts), "attempts", statusInboxAttemptsObjective-1,
		"auroractl inbox inventory", "AuroraInboxAttemptsGrowing")
	rc := s.Reconciliation
	add("reconciliation open items", float64(rc.OpenTotal()), "items", 0,
		"auroractl reconcile list   (then: auroractl reconcile inspect <id>)", "AuroraReconciliationItemOpenTooLong")
	for _, kind := range sortedKeys(rc.OpenByKind) {
		if n := rc.OpenByKind[kind]; n != 0 {
			add("  open "+kind, float64(n), "items", 0, "auroractl reconcile list", "AuroraReconciliationItemOpenTooLong")
		}
	}
	add("reconciliation oldest open", rc.OldestOpenAgeSeconds(), "seconds", statusReconOpenObjective,
		"auroractl reconcile list", "AuroraReconciliationItemOpenTooLong")
	ev := s.Events
	add("domain events dead-lettered in the outbox", float64(ev.OutboxDeadLetters), "events", 0,
		psqlEventDeadLetters, "AuroraEventDeadLetters")
	add("domain events not yet dispatched, oldest", ev.UndispatchedOldestAgeSeconds, "seconds", statusEventDispatchObjective,
		"nats stream info AURORA_EVENTS   (is the relay publishing?)", "AuroraEventDispatchBehind")
	add("domain event consumer dead letters", float64(ev.ConsumerDeadLetterTotal()), "events", 0,
		psqlConsumerDeadLetters, "AuroraEventDeadLetters")
	for _, c := range sortedKeys(ev.ConsumerDeadLetters) {
		if n := ev.ConsumerDeadLetters[c]; n != 0 {
			add("  dead letters of consumer "+c, float64(n), "events", 0, psqlConsumerDeadLetters, "AuroraEventDeadLetters")
		}
	}
	for _, c := range sortedKeys(ev.ConsumerLagSeconds) {
		if lag := ev.ConsumerLagSeconds[c]; lag != 0 {
			add("  catch-up lag of consumer "+c, lag, "seconds", statusEventLagObjective,
				"is consumer "+c+" running?   (then: "+psqlConsumerFailing+")", "AuroraEventConsumerLagging")
		}
	}
	return out
}

// The domain events' first commands (RUNBOOK.md, AuroraEventDeadLetters and
// AuroraEventConsumerLagging): rows without payloads.
const (
	psqlEventDeadLetters    = `psql "$AURORA_DATABASE_URL" -c "SELECT event_id, event_type, attempts, last_reason, left(last_error, 200) FROM event_outbox WHERE status = 'dead_letter' ORDER BY dead_lettered_at LIMIT 20"`
	psqlConsumerDeadLetters = `psql "$AURORA_DATABASE_URL" -c "SELECT consumer, event_id, attempts, dead_letter_reason, left(last_error, 200) FROM event_inbox WHERE dead_lettered_at IS NOT NULL ORDER BY dead_lettered_at LIMIT 20"`
	psqlConsumerFailing     = `psql "$AURORA_DATABASE_URL" -c "SELECT consumer, event_id, attempts, next_attempt_at, left(last_error, 200) FROM event_inbox WHERE status = 'failed' AND dead_lettered_at IS NULL ORDER BY next_attempt_at LIMIT 20"`
)

// psqlOldestOpen lists the oldest items a deliverer still has to move,
// with why their last attempt failed (no payload, no customer id).
const psqlOldestOpen = `psql "$AURORA_DATABASE_URL" -c "SELECT o.id, o.state, o.attempts, o.next_attempt_at, o.lease_expires_at, o.last_error FROM outbox_undecided u JOIN outbox_items o ON o.id = u.item_id WHERE o.state IN ('pending','leased') ORDER BY u.item_id LIMIT 20"`

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
			v = statusAge(l.Value)
		} else if int64(l.Value) == int64(s.CountCap) {
			v += "+" // a capped count: at least this many
		}
		next := l.Next
		if next != "" && l.Runbook != "" {
			next += "   [RUNBOOK.md: " + l.Runbook + "]"
		}
		if l.Attention {
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

// statusAge shows an age in seconds to the second ("1h2m3s"), "<1s" for
// one younger than half a second, and "-" for none (an age of 0 means no
// such item).
func statusAge(seconds float64) string {
	if seconds <= 0 {
		return "-"
	}
	if seconds < 0.5 {
		return "<1s"
	}
	return time.Duration(math.Round(seconds) * float64(time.Second)).String()
}
