package chaos

import (
	"context"
	"fmt"
	"sort"
	"time"
)

// EventsReport is what the domain-event checker and the reconciler check
// found (Report.Events).
type EventsReport struct {
	// Published: InvoicePaid.v1 events the producer committed.
	Published int `json:"published"`
	// Outbox rows by status (every one of them should be acknowledged).
	OutboxByStatus map[string]int `json:"outbox_by_status"`
	// Processed: the ledger consumer's processed inbox rows of published
	// events; Posted: ledger entries of published events.
	Processed int `json:"processed"`
	Posted    int `json:"posted"`
	// DuplicatesSkipped: deliveries the inbox skipped (the processed rows'
	// duplicate_deliveries: the second claimer, a redelivery, the other path).
	DuplicatesSkipped int `json:"duplicates_skipped"`
	// HandlerRetries: inbox rows that needed more than one attempt.
	HandlerRetries int `json:"handler_retries"`
	// DeadLetters: inbox rows dead-lettered plus outbox rows dead_letter.
	DeadLetters int `json:"dead_letters"`
	// Missing: published events not processed and posted once; Extra: rows
	// (outbox, inbox or ledger) of no published event; Wrong: postings
	// whose amount or lines do not match the event.
	Missing int `json:"missing"`
	Extra   int `json:"extra"`
	Wrong   int `json:"wrong"`
	// WaitSeconds: from the drain of the usage outbox to every event
	// acknowledged (bounded by the wait).
	WaitSeconds float64 `json:"wait_seconds"`

	// The reconciler: runs recorded (ok and failed: a killed run leaves
	// one unfinished), items confirmed before the final run (by the
	// supervised process, during the load and drain) and after it, the
	// reconciliation items opened during the whole run by kind, and the
	// final run's findings by kind and its unsettled windows.
	ReconcilerRuns         int            `json:"reconciler_runs"`
	ReconcilerRunsOK       int            `json:"reconciler_runs_ok"`
	ConfirmedBeforeFinal   int            `json:"confirmed_before_final"`
	Confirmed              int            `json:"confirmed"`
	FindingsOpened         map[string]int `json:"reconciliation_items_by_kind"`
	FinalFindings          map[string]int `json:"final_findings_by_kind"`
	FinalWindowsCompared   int            `json:"final_windows_compared"`
	FinalWindowsUnsettled  int            `json:"final_windows_unsettled"`
	FinalReconcilerFailure string         `json:"final_reconciler_failure,omitempty"`
}

// eventsWait bounds how long the checker waits for every event to be
// acknowledged after the drain.
const eventsWait = 90 * time.Second

// inboxRow is one event_inbox row as the checker reads it.
type inboxRow struct {
	consumer   string
	eventID    string
	status     string
	attempts   int
	duplicates int
	dead       bool
}

// postingRow is one ledger entry with what its lines add up to.
type postingRow struct {
	eventID                 string
	amount                  int64
	debitSum, creditSum     int64 // the entry's lines by side: amounts
	debitLines, creditLines int   // and how many
}

// judgeEvents states the exactly-once invariants over what the database
// holds: every published event (id → amount) has its outbox row
// acknowledged, exactly one processed, not dead-lettered inbox row of
// consumer and exactly one posting of its amount with one debit and one
// credit line of that amount; no row of any kind belongs to no published
// event. It fills the counts of rep and returns the failures.
func judgeEvents(rep *EventsReport, published map[string]int64, consumer string, outbox map[string]string, inbox []inboxRow, posts []postingRow) []string {
	var fails []string
	rep.Published = len(published)
	rep.OutboxByStatus = map[string]int{}
	for id, st := range outbox {
		rep.OutboxByStatus[st]++
		if _, ok := published[id]; !ok {
			rep.Extra++
		}
		if st == "dead_letter" {
			rep.DeadLetters++
		}
	}
	processed := map[string]int{}
	for _, in := range inbox {
		if in.dead {
			rep.DeadLetters++
		}
		if in.attempts > 1 {
			rep.HandlerRetries++
		}
		rep.DuplicatesSkipped += in.duplicates
		if _, ok := published[in.eventID]; !ok || in.consumer != consumer {
			rep.Extra++
			continue
		}
		if in.status == "processed" && !in.dead {
			processed[in.eventID]++
		}
	}
	posted := map[string]int{}
	for _, p := range posts {
		amount, ok := published[p.eventID]
		if !ok {
			rep.Extra++
			continue
		}
		posted[p.eventID]++
		if p.amount != amount || p.debitSum != amount || p.creditSum != amount || p.debitLines != 1 || p.creditLines != 1 {
			rep.Wrong++
		}
	}
	var missing, twice, unacked []string
	for id := range published {
		switch {
		case processed[id] == 0 || posted[id] == 0:
			missing = append(missing, id)
		case processed[id] > 1 || posted[id] > 1:
			twice = append(twice, id)
		}
		if processed[id] == 1 {
			rep.Processed++
		}
		if posted[id] == 1 {
			rep.Posted++
		}
		if outbox[id] != "acknowledged" {
			unacked = append(unacked, id)
		}
	}
	rep.Missing = len(missing)
	sort.Strings(missing)
	sort.Strings(twice)
	if len(missing) > 0 {
		fails = append(fails, fmt.Sprintf("domain events: %d of %d published events not processed and posted by %s (first %s)", len(missing), len(published), consumer, missing[0]))
	}
	if len(twice) > 0 {
		fails = append(fails, fmt.Sprintf("domain events: %d events processed or posted more than once (first %s)", len(twice), twice[0]))
	}
	if len(unacked) > 0 {
		fails = append(fails, fmt.Sprintf("domain events: %d published events whose outbox row is not acknowledged (by status: %v)", len(unacked), rep.OutboxByStatus))
	}
	if rep.Extra > 0 {
		fails = append(fails, fmt.Sprintf("domain events: %d outbox, inbox or ledger rows of no published event", rep.Extra))
	}
	if rep.Wrong > 0 {
		fails = append(fails, fmt.Sprintf("domain events: %d postings whose amount or lines do not match their event", rep.Wrong))
	}
	if rep.DeadLetters > 0 {
		fails = append(fails, fmt.Sprintf("domain events: %d dead letters (inbox or dispatch)", rep.DeadLetters))
	}
	return fails
}

// moneyKinds are reconciliation kinds that mean usage lost, billed twice
// or billed wrong. summary_shortfall and summary_excess fail the run when
// the final run (after the drain) finds them; the rest fail it whenever
// they were opened: nothing the harness does should cause them.
var moneyKinds = map[string]bool{
	"summary_shortfall": true, "summary_excess": true, "async_rejection": true, "error_report_unattributed": true,
	"unconfirmed_acceptance": true, "late_after_finalization": true, "invoice_quantity_mismatch": true,
	"reversal_without_grant": true, "local_drift": true,
}

// judgeReconciler states the reconciler's invariants: the final run (after
// the drain) compared every window and found nothing; every item staged is
// confirmed after it; no reconciliation item of a kind the load cannot
// explain was opened at any time (a summary window compared during the
// load may differ while an answer is in flight: such items are counted in
// FindingsOpened, and fail the run only if the final run still finds them).
func judgeReconciler(rep *EventsReport, staged int) []string {
	var fails []string
	if rep.FinalReconcilerFailure != "" {
		return []string{"reconciler: final run failed: " + rep.FinalReconcilerFailure}
	}
	for k, n := range rep.FinalFindings {
		if n > 0 && moneyKinds[k] {
			fails = append(fails, fmt.Sprintf("reconciler: the final run found %d %s", n, k))
		}
	}
	for k, n := range rep.FindingsOpened {
		if n > 0 && moneyKinds[k] && k != "summary_shortfall" && k != "summary_excess" {
			fails = append(fails, fmt.Sprintf("reconciler: %d %s opened during the run", n, k))
		}
	}
	if rep.FinalWindowsUnsettled > 0 {
		fails = append(fails, fmt.Sprintf("reconciler: the final run left %d windows unsettled", rep.FinalWindowsUnsettled))
	}
	if rep.Confirmed != staged {
		fails = append(fails, fmt.Sprintf("reconciler: %d of %d items confirmed after the final run", rep.Confirmed, staged))
	}
	sort.Strings(fails)
	return fails
}

// checkEvents waits (bounded) until every published event is
// acknowledged, checks the exactly-once invariants, runs the final
// reconciliation and checks it; failures go to rep.Failures.
func (r *run) checkEvents(ctx context.Context, rep *Report, staged int) error {
	er := &EventsReport{}
	rep.Events = er
	published := r.published(staged)
	began := time.Now()
	for {
		var acked, processed int
		if err := r.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM event_outbox WHERE status = 'acknowledged'),
			(SELECT count(*) FROM event_inbox WHERE consumer = $1 AND status = 'processed')`, ledgerConsumer).Scan(&acked, &processed); err != nil {
			return err
		}
		if acked >= len(published) && processed >= len(published) || time.Since(began) > eventsWait {
			break
		}
		r.logf("events: %d of %d acknowledged", acked, len(published))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
	er.WaitSeconds = time.Since(began).Seconds()

	outbox := map[string]string{}
	rows, err := r.pool.Query(ctx, `SELECT event_id::text, status FROM event_outbox`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var id, st string
		if err := rows.Scan(&id, &st); err != nil {
			rows.Close()
			return err
		}
		outbox[id] = st
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	var inbox []inboxRow
	rows, err = r.pool.Query(ctx, `SELECT consumer, event_id::text, status, attempts, duplicate_deliveries, dead_lettered_at IS NOT NULL FROM event_inbox`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var in inboxRow
		if err := rows.Scan(&in.consumer, &in.eventID, &in.status, &in.attempts, &in.duplicates, &in.dead); err != nil {
			rows.Close()
			return err
		}
		inbox = append(inbox, in)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	var posts []postingRow
	rows, err = r.pool.Query(ctx, `SELECT e.event_id::text, e.amount,
		coalesce(sum(l.amount) FILTER (WHERE l.side = 'debit'), 0), coalesce(sum(l.amount) FILTER (WHERE l.side = 'credit'), 0),
		count(*) FILTER (WHERE l.side = 'debit'), count(*) FILTER (WHERE l.side = 'credit')
		FROM ledger_entries e LEFT JOIN ledger_lines l USING (event_id) GROUP BY e.event_id, e.amount`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var p postingRow
		if err := rows.Scan(&p.eventID, &p.amount, &p.debitSum, &p.creditSum, &p.debitLines, &p.creditLines); err != nil {
			rows.Close()
			return err
		}
		posts = append(posts, p)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	rep.Failures = append(rep.Failures, judgeEvents(er, published, ledgerConsumer, outbox, inbox, posts)...)

	// The reconciler: what the supervised process did, then one final run.
	if err := r.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE ok) FROM reconciler_runs WHERE kind = 'provider'`).Scan(&er.ReconcilerRuns, &er.ReconcilerRunsOK); err != nil {
		return err
	}
	if err := r.pool.QueryRow(ctx, `SELECT count(*) FROM outbox_items WHERE state = 'confirmed'`).Scan(&er.ConfirmedBeforeFinal); err != nil {
		return err
	}
	final, err := r.reconcileOnce(ctx)
	if err != nil {
		er.FinalReconcilerFailure = err.Error()
	} else {
		er.FinalFindings, er.FinalWindowsCompared, er.FinalWindowsUnsettled = final.Findings, final.WindowsCompared, final.WindowsUnsettled
	}
	if err := r.pool.QueryRow(ctx, `SELECT count(*) FROM outbox_items WHERE state = 'confirmed'`).Scan(&er.Confirmed); err != nil {
		return err
	}
	er.FindingsOpened = map[string]int{}
	rows, err = r.pool.Query(ctx, `SELECT kind, count(*) FROM reconciliation_items GROUP BY kind`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var k string
		var n int
		if err := rows.Scan(&k, &n); err != nil {
			rows.Close()
			return err
		}
		er.FindingsOpened[k] = n
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	rep.Failures = append(rep.Failures, judgeReconciler(er, staged)...)
	return nil
}
