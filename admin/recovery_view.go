package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/aurora-billing/aurora/recovery"
	"github.com/aurora-billing/aurora/shared/outbox"
)

// recoveryItemView is the JSON shape of an outbox item in auroractl's output:
// every column, snake_case, times in UTC.
type recoveryItemView struct {
	ID                 int64           `json:"id"`
	Tenant             string          `json:"tenant"`
	SubjectKind        string          `json:"subject_kind"`
	SubjectRef         string          `json:"subject_ref"`
	Exporter           string          `json:"exporter"`
	DestinationAccount string          `json:"destination_account"`
	Mode               string          `json:"mode"`
	MappingVersion     int32           `json:"mapping_version"`
	IdempotencyKey     string          `json:"idempotency_key"`
	Feature            string          `json:"feature"`
	Quantity           int64           `json:"quantity"`
	OccurredAt         time.Time       `json:"occurred_at"`
	PeriodStart        time.Time       `json:"period_start"`
	Payload            json.RawMessage `json:"payload"`
	State              outbox.State    `json:"state"`
	QuarantineReason   *outbox.Reason  `json:"quarantine_reason"`
	LeaseToken         int64           `json:"lease_token"`
	LeaseExpiresAt     *time.Time      `json:"lease_expires_at"`
	Attempts           int32           `json:"attempts"`
	NextAttemptAt      time.Time       `json:"next_attempt_at"`
	FirstAttemptAt     *time.Time      `json:"first_attempt_at"`
	Dispatch           int32           `json:"dispatch"`
	PublishedDispatch  int32           `json:"published_dispatch"`
	PublishedAt        *time.Time      `json:"published_at"`
	LastError          *string         `json:"last_error"`
	ProviderRef        *string         `json:"provider_ref"`
	CreatedAt          time.Time       `json:"created_at"`
	UpdatedAt          time.Time       `json:"updated_at"`
}

func recoveryUTC(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

func recoveryItemOf(r outbox.Row) recoveryItemView {
	payload := r.Payload
	if len(payload) == 0 {
		payload = json.RawMessage("{}")
	}
	return recoveryItemView{
		ID: r.ID, Tenant: r.Tenant, SubjectKind: string(r.SubjectKind), SubjectRef: r.SubjectRef, Exporter: r.Exporter,
		DestinationAccount: r.DestinationAccount, Mode: string(r.Mode), MappingVersion: r.MappingVersion,
		IdempotencyKey: r.IdempotencyKey, Feature: r.Feature, Quantity: r.Quantity, OccurredAt: r.OccurredAt.UTC(),
		PeriodStart: r.PeriodStart.UTC(), Payload: payload, State: r.State, QuarantineReason: r.QuarantineReason,
		LeaseToken: r.LeaseToken, LeaseExpiresAt: recoveryUTC(r.LeaseExpiresAt), Attempts: r.Attempts,
		NextAttemptAt: r.NextAttemptAt.UTC(), FirstAttemptAt: recoveryUTC(r.FirstAttemptAt), Dispatch: r.Dispatch,
		PublishedDispatch: r.PublishedDispatch, PublishedAt: recoveryUTC(r.PublishedAt), LastError: r.LastError,
		ProviderRef: r.ProviderRef, CreatedAt: r.CreatedAt.UTC(), UpdatedAt: r.UpdatedAt.UTC(),
	}
}

type recoveryInspectView struct {
	Item                  recoveryItemView   `json:"item"`
	SearchIdentifier      string             `json:"search_identifier"`
	CurrentMappingVersion int32              `json:"current_mapping_version"`
	Link                  *recovery.Link     `json:"link"`
	Expected              recovery.Expected  `json:"expected"`
	Attempts              []recovery.Attempt `json:"attempts"`
	Actions               []recovery.Action  `json:"actions"`
}

func recoveryInspectOf(ins recovery.Inspection) recoveryInspectView {
	return recoveryInspectView{Item: recoveryItemOf(ins.Item), SearchIdentifier: ins.SearchIdentifier, CurrentMappingVersion: ins.CurrentMappingVersion,
		Link: ins.Link, Expected: ins.Expected, Attempts: ins.Attempts, Actions: ins.Actions}
}

type recoveryDryRunView struct {
	DryRun       bool              `json:"dry_run"`
	Action       recovery.Kind     `json:"action"`
	Item         recoveryItemView  `json:"item"`
	Change       recovery.Change   `json:"change"`
	Expected     recovery.Expected `json:"expected"`
	Actor        string            `json:"actor"`
	Reason       string            `json:"reason"`
	Evidence     string            `json:"evidence"`
	ApplyCommand string            `json:"apply_command"`
}

type recoveryAppliedView struct {
	Applied  bool              `json:"applied"`
	Action   recovery.Action   `json:"action"`
	Item     recoveryItemView  `json:"item"`
	Change   *recovery.Change  `json:"change"`
	Restaged *recoveryItemView `json:"restaged_item,omitempty"`
}

type recoveryRefusedView struct {
	Applied bool             `json:"applied"`
	DryRun  bool             `json:"dry_run"`
	Action  recovery.Kind    `json:"action"`
	ItemID  int64            `json:"item_id"`
	Refusal recovery.Refusal `json:"refusal"`
	Error   string           `json:"error"`
	// Fields names the expected fields that differ (expected_state_mismatch).
	Fields []string `json:"fields,omitempty"`
	// Current is the row as it is now.
	Current *recoveryItemView `json:"current,omitempty"`
	// Recorded is the refused action written (nil in a dry run).
	Recorded *recovery.Action `json:"recorded_action"`
}

func recoveryRefusalOf(err error, kind recovery.Kind, id int64, dryRun bool, row outbox.Row, act *recovery.Action) recoveryRefusedView {
	v := recoveryRefusedView{DryRun: dryRun, Action: kind, ItemID: id, Refusal: recovery.RefusalOf(err), Error: err.Error(), Recorded: act}
	var mm *recovery.ExpectedStateMismatchError
	if errors.As(err, &mm) {
		v.Fields = mm.Fields
		row = mm.Current
	}
	if row.ID != 0 {
		cur := recoveryItemOf(row)
		v.Current = &cur
	}
	return v
}

func recoveryTS(t time.Time) string { return t.UTC().Format(time.RFC3339) }

func recoveryTSPtr(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return recoveryTS(*t)
}

func recoveryStr(s *string) string {
	if s == nil {
		return "-"
	}
	return *s
}

func recoveryReason(r *outbox.Reason) string {
	if r == nil {
		return "-"
	}
	return string(*r)
}

func renderRecoveryList(w io.Writer, state string, olderThan time.Duration, rows []outbox.Row) error {
	if len(rows) == 0 {
		_, err := fmt.Fprintf(w, "no %s items older than %s\n", state, olderThan)
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tREASON\tATTEMPTS\tLEASE\tSINCE\tTENANT\tKIND\tSUBJECT_REF")
	for _, r := range rows {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\n", r.ID, r.State, recoveryReason(r.QuarantineReason), r.Attempts,
			r.LeaseToken, recoveryTS(r.UpdatedAt), r.Tenant, r.SubjectKind, r.SubjectRef)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "%d item(s); next: auroractl recovery inspect <id>\n", len(rows))
	return err
}

func renderRecoveryItem(tw *tabwriter.Writer, r outbox.Row) {
	fmt.Fprintf(tw, "  state\t%s\n", r.State)
	if r.QuarantineReason != nil {
		fmt.Fprintf(tw, "  quarantine_reason\t%s\n", *r.QuarantineReason)
	}
	fmt.Fprintf(tw, "  tenant\t%s\n", r.Tenant)
	fmt.Fprintf(tw, "  subject\t%s %s\n", r.SubjectKind, r.SubjectRef)
	fmt.Fprintf(tw, "  destination\t%s (%s) via %s\n", r.DestinationAccount, r.Mode, r.Exporter)
	fmt.Fprintf(tw, "  mapping_version\t%d\n", r.MappingVersion)
	fmt.Fprintf(tw, "  feature\t%s\n", r.Feature)
	fmt.Fprintf(tw, "  quantity\t%d\n", r.Quantity)
	fmt.Fprintf(tw, "  occurred_at\t%s (period %s)\n", recoveryTS(r.OccurredAt), recoveryTS(r.PeriodStart))
	fmt.Fprintf(tw, "  identifier\t%s\n", r.IdempotencyKey)
	fmt.Fprintf(tw, "  lease_token\t%d\n", r.LeaseToken)
	fmt.Fprintf(tw, "  attempts\t%d (first %s)\n", r.Attempts, recoveryTSPtr(r.FirstAttemptAt))
	fmt.Fprintf(tw, "  dispatch\t%d (published %d)\n", r.Dispatch, r.PublishedDispatch)
	fmt.Fprintf(tw, "  last_error\t%s\n", recoveryStr(r.LastError))
	fmt.Fprintf(tw, "  provider_ref\t%s\n", recoveryStr(r.ProviderRef))
	fmt.Fprintf(tw, "  created_at\t%s\n", recoveryTS(r.CreatedAt))
	fmt.Fprintf(tw, "  updated_at\t%s\n", recoveryTS(r.UpdatedAt))
}

func renderRecoveryExpected(tw *tabwriter.Writer, e recovery.Expected) {
	fmt.Fprintf(tw, "  state\t%s\n", e.State)
	fmt.Fprintf(tw, "  lease_token\t%d\n", e.LeaseToken)
	fmt.Fprintf(tw, "  subject_ref\t%s\n", e.SubjectRef)
	if e.ProviderRef != nil {
		fmt.Fprintf(tw, "  provider_ref\t%s\n", *e.ProviderRef)
	}
}

func renderRecoveryLink(tw *tabwriter.Writer, l *recovery.Link) {
	switch {
	case l == nil:
		fmt.Fprintf(tw, "  link\tnone (no usage fact points at this item; abandoning it restages nothing)\n")
	case l.Kind == recovery.LinkUsageWindow:
		fmt.Fprintf(tw, "  link\tusage window %s %s %s: generation %d, acknowledged_to %d\n",
			l.Tenant, l.Feature, recoveryTS(*l.PeriodStart), *l.Generation, *l.AcknowledgedTo)
	case l.Kind == recovery.LinkUsageEvent:
		fmt.Fprintf(tw, "  link\tusage event %s %s\n", l.Tenant, l.EventID)
	}
}

func renderRecoveryInspect(w io.Writer, ins recovery.Inspection) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "item %d\n", ins.Item.ID)
	renderRecoveryItem(tw, ins.Item)
	fmt.Fprintf(tw, "  current mapping\t%d\n", ins.CurrentMappingVersion)
	renderRecoveryLink(tw, ins.Link)
	fmt.Fprintf(tw, "search at Stripe\n")
	fmt.Fprintf(tw, "  identifier\t%s\n", ins.SearchIdentifier)
	fmt.Fprintf(tw, "  \t(the meter event identifier and Idempotency-Key; search the request logs and meter events for it)\n")
	fmt.Fprintf(tw, "expected state (pin it with --expect-state, --expect-lease-token, --expect-subject-ref)\n")
	renderRecoveryExpected(tw, ins.Expected)
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "attempts (%d)\n", len(ins.Attempts))
	if len(ins.Attempts) > 0 {
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  #\tLEASE\tSTARTED\tFINISHED\tOUTCOME\tHTTP\tREQUEST\tERROR")
		for _, a := range ins.Attempts {
			status := "-"
			if a.HTTPStatus != nil {
				status = strconv.Itoa(int(*a.HTTPStatus))
			}
			errText := recoveryStr(a.ErrorCode)
			if a.ErrorMessage != nil {
				errText += ": " + *a.ErrorMessage
			}
			fmt.Fprintf(tw, "  %d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", a.Attempt, a.LeaseToken, recoveryTS(a.StartedAt), recoveryTSPtr(a.FinishedAt),
				recoveryStr(a.Outcome), status, recoveryStr(a.StripeRequestID), errText)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	fmt.Fprintf(w, "recovery actions (%d)\n", len(ins.Actions))
	if len(ins.Actions) > 0 {
		return renderRecoveryActionTable(w, ins.Actions, "  ")
	}
	return nil
}

func renderRecoveryActions(w io.Writer, acts []recovery.Action) error {
	if len(acts) == 0 {
		_, err := fmt.Fprintln(w, "no recovery actions")
		return err
	}
	return renderRecoveryActionTable(w, acts, "")
}

func renderRecoveryActionTable(w io.Writer, acts []recovery.Action, indent string) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, indent+"ID\tAT\tACTOR\tACTION\tRESULT\tREASON\tEVIDENCE")
	for _, a := range acts {
		result := "applied"
		if a.Refusal != nil {
			result = "refused: " + string(*a.Refusal)
		}
		fmt.Fprintf(tw, "%s%d\t%s\t%s\t%s\t%s\t%s\t%s\n", indent, a.ID, recoveryTS(a.CreatedAt), a.Actor, a.Action, result,
			recoveryOneLine(a.Reason), recoveryOneLine(a.Evidence))
	}
	return tw.Flush()
}

// recoveryOneLine keeps a table row on one line.
func recoveryOneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if s == "" {
		return "-"
	}
	return strconv.Quote(s)
}

func renderRecoveryChange(tw *tabwriter.Writer, c recovery.Change) {
	fmt.Fprintf(tw, "  state\t%s -> %s\n", c.From, c.To)
	if c.ProviderRef != nil {
		fmt.Fprintf(tw, "  provider_ref\t-> %s\n", *c.ProviderRef)
	}
	if c.ClearQuarantineReason != nil {
		fmt.Fprintf(tw, "  quarantine_reason\t%s -> (cleared)\n", *c.ClearQuarantineReason)
	}
	if c.Dispatch != nil {
		fmt.Fprintf(tw, "  dispatch\t-> %d (the relay publishes it again; next_attempt_at -> now)\n", *c.Dispatch)
	}
	if w := c.Window; w != nil {
		fmt.Fprintf(tw, "  usage window\t%s %s %s: staged link to item %d cleared\n", w.Tenant, w.Feature, recoveryTS(w.PeriodStart), w.ClearStagedItemID)
		if w.AcknowledgedToTo != w.AcknowledgedToFrom {
			fmt.Fprintf(tw, "  acknowledged_to\t%d -> %d (the next window starts there: new work, a new identity)\n", w.AcknowledgedToFrom, w.AcknowledgedToTo)
		}
		if w.GenerationTo != w.GenerationFrom {
			fmt.Fprintf(tw, "  generation\t%d -> %d\n", w.GenerationFrom, w.GenerationTo)
		}
		if w.SameBoundsSubjectRef != "" {
			fmt.Fprintf(tw, "  restages as\t%s (same bounds; new identifier %s) and is SENT AGAIN\n", w.SameBoundsSubjectRef, w.SameBoundsKey)
		}
	}
	if r := c.Restage; r != nil {
		id := ""
		if r.ItemID != 0 {
			id = fmt.Sprintf("item %d ", r.ItemID)
		}
		fmt.Fprintf(tw, "  restages as\t%sevent %s: %s, mapping version %d, new identifier %s, and is SENT AGAIN\n",
			id, r.EventID, r.SubjectRef, r.MappingVersion, r.IdempotencyKey)
	}
	if r := c.Rebuild; r != nil {
		id := ""
		if r.ItemID != 0 {
			id = fmt.Sprintf("item %d ", r.ItemID)
		}
		fmt.Fprintf(tw, "  rebuilt as	%s%s for mapping version %d -> %d, SAME identifier %s (Stripe deduplicates), dispatch %d\n",
			id, r.SubjectRef, r.MappingVersionFrom, r.MappingVersionTo, r.IdempotencyKey, r.Dispatch)
		if r.Link != nil {
			fmt.Fprintf(tw, "  link	%s of %s moves to the rebuilt item\n", r.Link.Kind, r.Link.Tenant)
		}
	}
	if c.Action == recovery.KindAbandon && c.Window == nil && c.Restage == nil {
		fmt.Fprintf(tw, "  restages as\tnothing (no usage fact links this item)\n")
	}
}

func renderRecoveryDryRun(w io.Writer, kind recovery.Kind, p recovery.Preview, actor, reason, evidence, cmdline string) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "DRY RUN: nothing was written. %s item %d\n", kind, p.Item.ID)
	fmt.Fprintf(tw, "row\n")
	renderRecoveryItem(tw, p.Item)
	fmt.Fprintf(tw, "change it would make\n")
	renderRecoveryChange(tw, p.Change)
	fmt.Fprintf(tw, "expected state it would send\n")
	renderRecoveryExpected(tw, p.Expected)
	fmt.Fprintf(tw, "recorded as\n")
	fmt.Fprintf(tw, "  actor\t%s\n", actor)
	fmt.Fprintf(tw, "  reason\t%s\n", recoveryOneLine(reason))
	fmt.Fprintf(tw, "  evidence\t%s\n", recoveryOneLine(evidence))
	if err := tw.Flush(); err != nil {
		return err
	}
	if kind == recovery.KindAbandon {
		fmt.Fprintln(w, "A wrong abandonment double-bills: the subject is sent again under a new identifier. When unsure, leave the item uncertain.")
	}
	_, err := fmt.Fprintf(w, "To apply exactly this screen (refused if the row moves):\n  %s\n", cmdline)
	return err
}

func renderRecoveryApplied(w io.Writer, res recovery.Result) error {
	fmt.Fprintf(w, "applied: %s item %d: %s -> %s (recorded as action #%d by %s)\n",
		res.Action.Action, res.Item.ID, res.Change.From, res.Change.To, res.Action.ID, res.Action.Actor)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	renderRecoveryChange(tw, *res.Change)
	return tw.Flush()
}
