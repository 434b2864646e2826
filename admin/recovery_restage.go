package admin

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/aurora-billing/aurora/recovery"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/spf13/cobra"
)

// newRecoveryRestageCmd is `auroractl recovery restage`: rebuild quarantined
// items for their feature's current mapping version (recovery.Restage), one
// by id or every candidate of a feature.
func newRecoveryRestageCmd(asJSON *bool) *cobra.Command {
	f := &recoveryWriteFlags{kind: recovery.KindRestage}
	var feature, account, quarantineReason string
	var limit int
	cmd := &cobra.Command{
		Use:   "restage [<id>]",
		Short: "Rebuild quarantined items for the feature's current mapping version, same identifier (dry run without --yes)",
		Long: `Rebuild a quarantined item for its feature's CURRENT mapping version after
'auroractl provision meter' remapped the feature: a new pending item with the same
tenant, subject and destination account (so the SAME identifier: Stripe deduplicates
against anything the old item sent), the usage fact's link moved to it, the old item
rejected. Requeue refuses such items (mapping_changed); restage is the way out.

With <id>: that item (pin the screen with --expect-*, as for requeue). With --feature
instead: every quarantined item of the feature built for another version than the
current one (--account, --quarantine-reason narrow it; at most --limit), each with its
own expected state read now and its own audit row.

Refused (and recorded): mapping_unchanged (built for the current version: requeue it),
not_mapped (provision the meter first), already_restaged, still_buffered, a stale screen,
a blank --reason or --evidence.`,
		Example: `  auroractl recovery restage --feature api_calls --account acct_123        # what would be rebuilt
  auroractl recovery restage --feature api_calls --account acct_123 \
    --reason "api_calls remapped to the v2 meter" --evidence "provision meter: mtr_2, mapping_version 2" --yes
  auroractl recovery restage 42 --reason "…" --evidence "…" --yes`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch {
			case len(args) == 1 && feature != "":
				return invalidInput("give an item id or --feature, not both")
			case len(args) == 0 && feature == "":
				return invalidInput("give an item id, or --feature to restage every candidate of a feature")
			case limit < 1 || limit > recovery.MaxLimit:
				return invalidInput("--limit %d outside 1..%d", limit, recovery.MaxLimit)
			}
			return recoveryService(cmd.Context(), func(svc *recovery.Service) error {
				if len(args) == 1 {
					id, err := recoveryParseID(args[0])
					if err != nil {
						return err
					}
					row, err := svc.Get(cmd.Context(), id)
					if err != nil {
						return recoveryExit(err, id, nil)
					}
					return restageOne(cmd, svc, f, row, f.expected(cmd, row), *asJSON)
				}
				rows, err := svc.Restageable(cmd.Context(), recovery.RestageFilter{DestinationAccount: account, Feature: feature,
					Reason: outbox.Reason(quarantineReason), Limit: limit})
				if err != nil {
					return recoveryExit(err, 0, nil)
				}
				return restageMany(cmd, svc, f, rows, *asJSON)
			})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.reason, "reason", "", "why (required, non-blank)")
	fl.StringVar(&f.evidence, "evidence", "", "what shows the current mapping is the right one, e.g. the meter id and version (required, non-blank)")
	fl.StringVar(&f.actor, "actor", "", "who is acting (default $AURORA_ACTOR, else the OS user)")
	fl.BoolVar(&f.yes, "yes", false, "apply; without it nothing is written")
	fl.StringVar(&f.expectState, "expect-state", "", "with <id>, pin: the state you saw (default: a fresh read)")
	fl.Int64Var(&f.expectLeaseToken, "expect-lease-token", 0, "with <id>, pin: the lease token you saw (default: a fresh read)")
	fl.StringVar(&f.expectSubjectRef, "expect-subject-ref", "", "with <id>, pin: the subject ref you saw (default: a fresh read)")
	fl.StringVar(&f.expectProviderRef, "expect-provider-ref", "", "with <id>, pin: the provider ref you saw (default: a fresh read)")
	fl.StringVar(&feature, "feature", "", "restage every candidate of this feature instead of one id")
	fl.StringVar(&account, "account", "", "with --feature: only this destination account")
	fl.StringVar(&quarantineReason, "quarantine-reason", "", "with --feature: only items quarantined for this reason, e.g. feature_unmapped")
	fl.IntVar(&limit, "limit", recovery.DefaultLimit, fmt.Sprintf("with --feature: at most this many items (1..%d)", recovery.MaxLimit))
	return cmd
}

// restageOne previews or applies one restage, printing as the other write
// commands do.
func restageOne(cmd *cobra.Command, svc *recovery.Service, f *recoveryWriteFlags, row outbox.Row, expected recovery.Expected, asJSON bool) error {
	ctx, out := cmd.Context(), cmd.OutOrStdout()
	in := recovery.RestageInput{Expected: expected, Reason: f.reason, Evidence: f.evidence, Actor: Actor(f.actor)}
	if !f.yes {
		preview, err := svc.PreviewRestage(ctx, row.ID, in)
		if err != nil {
			if asJSON && recovery.RefusalOf(err) != "" {
				_ = recoveryJSON(out, recoveryRefusalOf(err, f.kind, row.ID, true, preview.Item, nil))
			}
			return restageExit(err, row.ID, nil)
		}
		cmdline := recoveryApplyCommand(f, row.ID, expected)
		if asJSON {
			return recoveryJSON(out, recoveryDryRunView{DryRun: true, Action: f.kind, Item: recoveryItemOf(preview.Item), Change: preview.Change,
				Expected: preview.Expected, Actor: in.Actor, Reason: f.reason, Evidence: f.evidence, ApplyCommand: cmdline})
		}
		return renderRecoveryDryRun(out, f.kind, preview, in.Actor, f.reason, f.evidence, cmdline)
	}
	res, err := svc.Restage(ctx, row.ID, in)
	if err != nil {
		var act *recovery.Action
		if res.Action.ID != 0 {
			act = &res.Action
		}
		if asJSON && recovery.RefusalOf(err) != "" {
			_ = recoveryJSON(out, recoveryRefusalOf(err, f.kind, row.ID, false, res.Item, act))
		}
		return restageExit(err, row.ID, act)
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

// restageOutcome is one item of a restage by filter.
type restageOutcome struct {
	ItemID      int64            `json:"item_id"`
	Applied     bool             `json:"applied"`
	DryRun      bool             `json:"dry_run"`
	Change      *recovery.Change `json:"change,omitempty"`
	Refusal     recovery.Refusal `json:"refusal,omitempty"`
	Error       string           `json:"error,omitempty"`
	ActionID    int64            `json:"action_id,omitempty"`
	RebuiltItem int64            `json:"rebuilt_item_id,omitempty"`
}

// restageMany previews or applies a restage of each row with its own
// expected state (as listed now). A refusal of one item is reported and
// the others go on; a failure stops. The exit status is ExitRefused when
// any item was refused.
func restageMany(cmd *cobra.Command, svc *recovery.Service, f *recoveryWriteFlags, rows []outbox.Row, asJSON bool) error {
	ctx, out := cmd.Context(), cmd.OutOrStdout()
	outcomes := make([]restageOutcome, 0, len(rows))
	refused := 0
	for _, row := range rows {
		in := recovery.RestageInput{Expected: recovery.ExpectedOf(row), Reason: f.reason, Evidence: f.evidence, Actor: Actor(f.actor)}
		o := restageOutcome{ItemID: row.ID, DryRun: !f.yes}
		var err error
		if !f.yes {
			// The listing previews every other rule before the operator
			// has written the reason and evidence the apply needs.
			if strings.TrimSpace(in.Reason) == "" {
				in.Reason = "(dry run)"
			}
			if strings.TrimSpace(in.Evidence) == "" {
				in.Evidence = "(dry run)"
			}
			var p recovery.Preview
			if p, err = svc.PreviewRestage(ctx, row.ID, in); err == nil {
				o.Change = &p.Change
			}
		} else {
			var res recovery.Result
			res, err = svc.Restage(ctx, row.ID, in)
			o.ActionID = res.Action.ID
			if err == nil {
				o.Applied, o.Change = true, res.Change
				o.RebuiltItem = res.Restaged.ID
			}
		}
		if err != nil {
			if recovery.RefusalOf(err) == "" {
				return err
			}
			refused++
			o.Refusal, o.Error = recovery.RefusalOf(err), err.Error()
		}
		outcomes = append(outcomes, o)
	}
	if asJSON {
		if err := recoveryJSON(out, map[string]any{"dry_run": !f.yes, "items": outcomes, "refused": refused}); err != nil {
			return err
		}
	} else {
		renderRestageMany(out, f, outcomes, refused)
	}
	if refused > 0 {
		return &ExitError{Code: ExitRefused, Msg: fmt.Sprintf("%d of %d items refused; see each line, then `auroractl recovery inspect <id>`", refused, len(rows))}
	}
	return nil
}

func renderRestageMany(w io.Writer, f *recoveryWriteFlags, outcomes []restageOutcome, refused int) {
	if len(outcomes) == 0 {
		fmt.Fprintln(w, "nothing to restage: no quarantined item of the feature is built for another mapping version than the current one")
		return
	}
	for _, o := range outcomes {
		switch {
		case o.Refusal != "":
			fmt.Fprintf(w, "item %d: refused %s: %s\n", o.ItemID, o.Refusal, o.Error)
		case o.Applied:
			fmt.Fprintf(w, "item %d: rebuilt as item %d for mapping version %d, same identifier %s (action #%d)\n",
				o.ItemID, o.RebuiltItem, o.Change.Rebuild.MappingVersionTo, o.Change.Rebuild.IdempotencyKey, o.ActionID)
		default:
			fmt.Fprintf(w, "item %d: would be rebuilt for mapping version %d -> %d, same identifier %s\n",
				o.ItemID, o.Change.Rebuild.MappingVersionFrom, o.Change.Rebuild.MappingVersionTo, o.Change.Rebuild.IdempotencyKey)
		}
	}
	if !f.yes {
		fmt.Fprintf(w, "DRY RUN: nothing was written (%d items, %d would be refused); add --reason \"…\" --evidence \"…\" --yes to apply\n", len(outcomes), refused)
	}
}

// restageExit is recoveryExit with the restage refusals.
func restageExit(err error, id int64, act *recovery.Action) error {
	recorded := ""
	if act != nil {
		recorded = " (refusal recorded as action #" + strconv.FormatInt(act.ID, 10) + ")"
	}
	var mu *recovery.MappingUnchangedError
	var ar *recovery.AlreadyRestagedError
	switch {
	case errors.As(err, &mu):
		return &ExitError{Code: ExitRefused, Err: err, Msg: fmt.Sprintf("mapping_unchanged: item %d is built for the current mapping version %d; fix the cause and `auroractl recovery requeue %d`%s", id, mu.Version, id, recorded)}
	case errors.Is(err, recovery.ErrNotMapped):
		return &ExitError{Code: ExitRefused, Err: err, Msg: fmt.Sprintf("not_mapped: item %d's feature has no meter mapping now; `auroractl provision meter` first%s", id, recorded)}
	case errors.As(err, &ar):
		return &ExitError{Code: ExitRefused, Err: err, Msg: fmt.Sprintf("already_restaged: item %d's work exists for mapping version %d as item %d; inspect that one%s", id, ar.Version, ar.ExistingID, recorded)}
	case errors.Is(err, recovery.ErrInvalidEvidence):
		return &ExitError{Code: ExitInvalidInput, Err: err, Msg: "invalid_evidence: --evidence is blank; say what shows the current mapping is right (meter id, mapping version)" + recorded}
	}
	return recoveryExit(err, id, act)
}
