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

	"github.com/aurora-billing/aurora/cutover"
	"github.com/aurora-billing/aurora/shared/config"
	"github.com/aurora-billing/aurora/shared/usage"
	"github.com/spf13/cobra"
)

// newCutoverCmd is `auroractl cutover`: seed 000, "Cutting a feature over
// from counting to recording". Read-only unless --yes.
func newCutoverCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "cutover",
		Short: "Schedule, watch and move the watermark that cuts a feature over from counting to recording",
		Long: `The watermark makes the split between the buffered reporter and durable events exclusive:
windows are staged only for periods starting before it; events only for periods starting on or
after it (earlier ones are quarantined period_buffered).

The procedure, in order, and the order is the point:
  1. auroractl cutover schedule --feature api_calls --at 2026-10-01T00:00:00Z --yes
  2. keep the reporter running; watch auroractl cutover status --feature api_calls until drained is true
  3. only then deploy AURORA_FEATURE_SOURCES=api_calls:events

This command never writes the source switch: moving the watermark and changing the source are
two decisions. Moving a scheduled watermark is a recovery action (reschedule), with the expected
state you read, a reason and evidence, recorded whether it applies or is refused.`,
	}
	cmd.PersistentFlags().BoolVar(&asJSON, "json", false, "print JSON on stdout")
	cmd.AddCommand(newCutoverScheduleCmd(&asJSON), newCutoverStatusCmd(&asJSON), newCutoverRescheduleCmd(&asJSON),
		newCutoverActionsCmd(&asJSON))
	return cmd
}

func cutoverWriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// usagePeriod loads AURORA_USAGE_PERIOD (the period watermarks must start).
func usagePeriod() (usage.Period, error) {
	var e config.Export
	if err := config.Load(&e); err != nil {
		return "", &ExitError{Code: ExitInvalidInput, Msg: err.Error(), Err: err}
	}
	return usage.Period(e.UsagePeriod), nil
}

func parseInstant(flag, v string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		return time.Time{}, invalidInput("--%s %q is not an RFC 3339 time, e.g. 2026-10-01T00:00:00Z", flag, v)
	}
	return t.UTC(), nil
}

func tenantLabel(t string) string {
	if t == "" {
		return "(all tenants without a cutover of their own)"
	}
	return t
}

func tenantFlag(t string) string {
	if t == "" {
		return ""
	}
	return " --tenant " + strconv.Quote(t)
}

// cutoverExit maps the cutover package's errors to exit codes with a
// one-line message that says what to do.
func cutoverExit(err error, feature, tenant string) error {
	var fe *cutover.FieldError
	var ae *cutover.AlreadyScheduledError
	var mm *cutover.ExpectedStateMismatchError
	var ce *cutover.ConflictError
	switch {
	case errors.As(err, &fe):
		return &ExitError{Code: ExitInvalidInput, Msg: fmt.Sprintf("--%s: %s", flagName(strings.ReplaceAll(fe.Field, "expected.", "expect_")), fe.Reason), Err: err}
	case errors.As(err, &ae):
		return &ExitError{Code: ExitRefused, Msg: fmt.Sprintf(
			"already_scheduled: %s already has a cutover at %s (version %d) for %s; move it with `auroractl cutover reschedule --feature %s%s --at … --expect-watermark %s --expect-version %d --reason … --evidence …`",
			feature, ae.Existing.At.Format(time.RFC3339), ae.Existing.Version, tenantLabel(ae.Existing.Tenant), feature, tenantFlag(ae.Existing.Tenant),
			ae.Existing.At.Format(time.RFC3339), ae.Existing.Version), Err: err}
	case errors.As(err, &mm):
		return &ExitError{Code: ExitStateMismatch, Msg: fmt.Sprintf(
			"expected_state_mismatch (recorded): the cutover is now watermark %s version %d; read `auroractl cutover status --feature %s%s` and decide again",
			mm.Current.Watermark.Format(time.RFC3339), mm.Current.Version, feature, tenantFlag(tenant)), Err: err}
	case errors.As(err, &ce):
		return &ExitError{Code: ExitRefused, Msg: "exported_across_watermark: " + strings.TrimPrefix(ce.Error(), "cutover: exported_across_watermark: ") +
			" already exported on the other side; that watermark would bill them twice", Err: err}
	case errors.Is(err, cutover.ErrNotScheduled):
		return &ExitError{Code: ExitNotFound, Msg: fmt.Sprintf("not_scheduled: no cutover for %s and %s; schedule one with `auroractl cutover schedule`", feature, tenantLabel(tenant)), Err: err}
	}
	return err
}

func newCutoverScheduleCmd(asJSON *bool) *cobra.Command {
	var feature, tenant, at, actor string
	var yes bool
	cmd := &cobra.Command{
		Use:   "schedule",
		Short: "Set the watermark of a feature (dry run without --yes)",
		Example: `  auroractl cutover schedule --feature api_calls --at 2026-10-01T00:00:00Z
  auroractl cutover schedule --feature api_calls --at 2026-10-01T00:00:00Z --tenant org_123 --yes`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			when, err := parseInstant("at", at)
			if err != nil {
				return err
			}
			period, err := usagePeriod()
			if err != nil {
				return err
			}
			in := cutover.ScheduleInput{Tenant: tenant, Feature: feature, At: when, Actor: Actor(actor), Period: period}
			pool, err := openPool(cmd)
			if err != nil {
				return err
			}
			defer pool.Close()
			var plan cutover.SchedulePlan
			if yes {
				plan, err = cutover.Schedule(cmd.Context(), pool, in)
			} else {
				plan, err = cutover.PlanSchedule(cmd.Context(), pool, in)
			}
			if err != nil {
				return cutoverExit(err, feature, tenant)
			}
			out := cmd.OutOrStdout()
			if *asJSON {
				return cutoverWriteJSON(out, map[string]any{"dry_run": !yes, "scheduled": yes, "cutover": plan.Watermark,
					"events_to_requeue": plan.EventsToRequeue, "source_switch": feature + ":events (deploy AURORA_FEATURE_SOURCES yourself, after drained)"})
			}
			if yes {
				fmt.Fprintln(out, "scheduled:")
			} else {
				fmt.Fprintln(out, "dry run: nothing written (add --yes to schedule). Would schedule:")
			}
			w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintf(w, "  feature\t%s\n  tenant\t%s\n  watermark\t%s\n  version\t%d\n  scheduled by\t%s\n",
				feature, tenantLabel(tenant), plan.Watermark.At.Format(time.RFC3339), plan.Watermark.Version, in.Actor)
			if plan.EventsToRequeue > 0 {
				fmt.Fprintf(w, "  events to requeue\t%d (quarantined period_buffered, now on or after the watermark)\n", plan.EventsToRequeue)
			}
			if err := w.Flush(); err != nil {
				return err
			}
			fmt.Fprintf(out, "next: keep the reporter running; watch `auroractl cutover status --feature %s%s` until drained is true;\n"+
				"only then deploy AURORA_FEATURE_SOURCES=%s:events (this command never writes it).\n", feature, tenantFlag(tenant), feature)
			return nil
		},
	}
	cmd.Flags().StringVar(&feature, "feature", "", "feature, e.g. api_calls (required)")
	cmd.Flags().StringVar(&at, "at", "", "the watermark, RFC 3339 at the start of a usage period, e.g. 2026-10-01T00:00:00Z (required)")
	cmd.Flags().StringVar(&tenant, "tenant", "", "one tenant; default all tenants without a cutover of their own")
	cmd.Flags().StringVar(&actor, "actor", "", "who schedules (default AURORA_ACTOR, else the OS user)")
	cmd.Flags().BoolVar(&yes, "yes", false, "write; without it, print what would be done")
	_ = cmd.MarkFlagRequired("feature")
	_ = cmd.MarkFlagRequired("at")
	return cmd
}

func newCutoverStatusCmd(asJSON *bool) *cobra.Command {
	var feature, tenant string
	cmd := &cobra.Command{
		Use:     "status",
		Short:   "Show the watermark and whether the buffered side has drained",
		Example: `  auroractl cutover status --feature api_calls --json`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pool, err := openPool(cmd)
			if err != nil {
				return err
			}
			defer pool.Close()
			st, err := cutover.StatusOf(cmd.Context(), pool, tenant, feature, nil)
			if err != nil {
				return cutoverExit(err, feature, tenant)
			}
			out := cmd.OutOrStdout()
			if *asJSON {
				return cutoverWriteJSON(out, st)
			}
			w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintf(w, "feature\t%s\ntenant\t%s\nwatermark\t%s (version %d, %s row)\nbuffered_periods_open\t%d\nevent_items\t%d\n",
				st.Feature, tenantLabel(st.Tenant), st.Watermark.Format(time.RFC3339), st.Version, strings.ReplaceAll(st.Governing, "_", "-"),
				st.BufferedPeriodsOpen, st.EventItems)
			if st.EventsToRequeue > 0 {
				fmt.Fprintf(w, "events_to_requeue\t%d\n", st.EventsToRequeue)
			}
			fmt.Fprintf(w, "watermark_passed\t%v\ndrained\t%v\n", st.WatermarkPassed, st.Drained)
			if err := w.Flush(); err != nil {
				return err
			}
			if st.Drained {
				fmt.Fprintf(out, "drained: you may now deploy AURORA_FEATURE_SOURCES=%s:events\n", st.Feature)
			} else {
				fmt.Fprintln(out, "not drained: keep the reporter running; do not switch the source yet")
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&feature, "feature", "", "feature, e.g. api_calls (required)")
	cmd.Flags().StringVar(&tenant, "tenant", "", "one tenant; default all tenants without a cutover of their own")
	_ = cmd.MarkFlagRequired("feature")
	return cmd
}

func newCutoverRescheduleCmd(asJSON *bool) *cobra.Command {
	var feature, tenant, at, expectWatermark, reason, evidence, actor string
	var expectVersion int
	var yes bool
	cmd := &cobra.Command{
		Use:   "reschedule",
		Short: "Move a scheduled watermark: a recovery action with expected state, reason and evidence (dry run without --yes)",
		Example: `  auroractl cutover reschedule --feature api_calls --at 2026-10-02T00:00:00Z \
    --expect-watermark 2026-10-01T00:00:00Z --expect-version 1 \
    --reason "finance moved the switch" --evidence "ticket FIN-42" --yes`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			when, err := parseInstant("at", at)
			if err != nil {
				return err
			}
			exp, err := parseInstant("expect-watermark", expectWatermark)
			if err != nil {
				return err
			}
			period, err := usagePeriod()
			if err != nil {
				return err
			}
			in := cutover.RescheduleInput{Tenant: tenant, Feature: feature, At: when,
				Expected: cutover.Expected{Watermark: exp, Version: int32(expectVersion)},
				Reason:   reason, Evidence: evidence, Actor: Actor(actor), Period: period}
			pool, err := openPool(cmd)
			if err != nil {
				return err
			}
			defer pool.Close()
			var res cutover.RescheduleResult
			if yes {
				res, err = cutover.Reschedule(cmd.Context(), pool, in)
			} else {
				res, err = cutover.PlanReschedule(cmd.Context(), pool, in)
			}
			if err != nil {
				return cutoverExit(err, feature, tenant)
			}
			out := cmd.OutOrStdout()
			expected := map[string]any{"watermark": in.Expected.Watermark, "version": in.Expected.Version}
			if *asJSON {
				return cutoverWriteJSON(out, map[string]any{"dry_run": !yes, "applied": yes, "action": cutover.ActionReschedule,
					"expected": expected, "before": res.Before, "after": res.After, "events_to_requeue": res.EventsToRequeue, "action_id": res.ActionID})
			}
			if yes {
				fmt.Fprintf(out, "rescheduled (recovery action %d recorded):\n", res.ActionID)
			} else {
				fmt.Fprintln(out, "dry run: nothing written (add --yes to reschedule; the call is recorded either way). Would change:")
			}
			w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintf(w, "  feature\t%s\n  tenant\t%s\n  watermark\t%s -> %s\n  version\t%d -> %d\n  expected state\twatermark=%s version=%d\n  reason\t%s\n  evidence\t%s\n  actor\t%s\n",
				feature, tenantLabel(tenant), res.Before.At.Format(time.RFC3339), res.After.At.Format(time.RFC3339),
				res.Before.Version, res.After.Version, in.Expected.Watermark.Format(time.RFC3339), in.Expected.Version, reason, evidence, in.Actor)
			if res.EventsToRequeue > 0 {
				fmt.Fprintf(w, "  events to requeue\t%d (quarantined period_buffered, now on or after the watermark)\n", res.EventsToRequeue)
			}
			return w.Flush()
		},
	}
	cmd.Flags().StringVar(&feature, "feature", "", "feature, e.g. api_calls (required)")
	cmd.Flags().StringVar(&tenant, "tenant", "", "the tenant whose own cutover moves; default the all-tenants cutover")
	cmd.Flags().StringVar(&at, "at", "", "the new watermark, RFC 3339 at the start of a usage period (required)")
	cmd.Flags().StringVar(&expectWatermark, "expect-watermark", "", "the watermark you read in `cutover status` (required)")
	cmd.Flags().IntVar(&expectVersion, "expect-version", 0, "the version you read in `cutover status` (required)")
	cmd.Flags().StringVar(&reason, "reason", "", "why the date moves (required)")
	cmd.Flags().StringVar(&evidence, "evidence", "", "what shows the move is right (required)")
	cmd.Flags().StringVar(&actor, "actor", "", "who (default AURORA_ACTOR, else the OS user)")
	cmd.Flags().BoolVar(&yes, "yes", false, "write; without it, print what would be done")
	for _, f := range []string{"feature", "at", "expect-watermark", "expect-version", "reason", "evidence"} {
		_ = cmd.MarkFlagRequired(f)
	}
	return cmd
}

func newCutoverActionsCmd(asJSON *bool) *cobra.Command {
	var feature, tenant string
	cmd := &cobra.Command{
		Use:     "actions",
		Short:   "List every reschedule call on a cutover, applied or refused",
		Example: `  auroractl cutover actions --feature api_calls --json`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pool, err := openPool(cmd)
			if err != nil {
				return err
			}
			defer pool.Close()
			acts, err := cutover.Actions(cmd.Context(), pool, tenant, feature)
			if err != nil {
				return cutoverExit(err, feature, tenant)
			}
			out := cmd.OutOrStdout()
			if *asJSON {
				if acts == nil {
					acts = []cutover.Action{}
				}
				return cutoverWriteJSON(out, map[string]any{"feature": feature, "tenant": tenant, "actions": acts})
			}
			if len(acts) == 0 {
				fmt.Fprintf(out, "no recorded calls for the cutover of %s, %s\n", feature, tenantLabel(tenant))
				return nil
			}
			w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "ID\tAT\tACTOR\tRESULT\tEXPECTED\tOBSERVED\tREASON\tEVIDENCE")
			for _, a := range acts {
				result := "applied"
				if a.Refusal != nil {
					result = "refused: " + *a.Refusal
				}
				fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", a.ID, a.At.UTC().Format(time.RFC3339), a.Actor, result,
					a.Expected, a.Observed, a.Reason, a.Evidence)
			}
			return w.Flush()
		},
	}
	cmd.Flags().StringVar(&feature, "feature", "", "feature, e.g. api_calls (required)")
	cmd.Flags().StringVar(&tenant, "tenant", "", "the tenant's own cutover; default the all-tenants cutover")
	_ = cmd.MarkFlagRequired("feature")
	return cmd
}
