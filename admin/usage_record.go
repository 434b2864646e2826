package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/aurora-billing/aurora/shared/usage"
	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"
)

// usageRefusal maps an error of the usage API to an auroractl error: a bad
// event is ExitInvalidInput, a refusal by what is already recorded
// (ErrEventConflict, the correction rules) is ExitRefused; anything else
// (the database) is returned as it is.
func usageRefusal(err error) error {
	if errors.Is(err, usage.ErrInvalidEvent) || errors.Is(err, outbox.ErrInvalidItem) {
		return &ExitError{Code: ExitInvalidInput, Msg: err.Error(), Err: err}
	}
	if isUsageDataError(err) {
		return &ExitError{Code: ExitRefused, Msg: err.Error(), Err: err}
	}
	return err
}

// isUsageDataError reports whether err is the usage API refusing one event
// (as opposed to the database failing): the same list as the demo's.
func isUsageDataError(err error) bool {
	for _, target := range []error{usage.ErrInvalidEvent, usage.ErrEventConflict, usage.ErrCorrectedUnknown,
		usage.ErrCorrectionExceeds, usage.ErrAlreadyCancelled, usage.ErrNotCorrection, outbox.ErrPayloadConflict, outbox.ErrInvalidItem} {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}

// recordView is the --json output of `usage record`.
type recordView struct {
	Created bool       `json:"created"` // false: the event was already recorded with this content
	Item    outbox.Row `json:"item"`
}

func newUsageRecordCmd() *cobra.Command {
	var tenant, eventID, feature, occurredAt, corrects string
	var quantity int64
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "record",
		Short: "Record one usage event (or a correction) with the services' rules, idempotently by tenant and event id",
		Example: `  auroractl usage record --tenant org_123 --event-id req-1 --feature api_calls --quantity 1
  auroractl usage record --tenant org_123 --event-id req-1-fix --feature api_calls --quantity -1 --corrects req-1`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			settings, err := exportSettings()
			if err != nil {
				return err
			}
			at := time.Now().UTC().Truncate(time.Second)
			if occurredAt != "" {
				t, err := time.Parse(time.RFC3339, occurredAt)
				if err != nil {
					return invalidInput("--occurred-at must be an RFC 3339 time, e.g. 2026-09-01T10:00:00Z")
				}
				at = t.UTC()
			}
			ev := usage.Event{Tenant: tenant, EventID: eventID, Feature: feature, Quantity: quantity, OccurredAt: at, CorrectsEventID: corrects}
			if err := ev.Validate(); err != nil {
				return usageRefusal(err)
			}
			pool, err := openPool(cmd)
			if err != nil {
				return err
			}
			defer pool.Close()
			ctx := cmd.Context()
			var view recordView
			err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				var err error
				view.Item, view.Created, err = settings.Gate().Record(ctx, tx, ev)
				return err
			})
			if err != nil {
				return usageRefusal(err)
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(view)
			}
			verb := "recorded"
			if !view.Created {
				verb = "already recorded (same content)"
			}
			line := fmt.Sprintf("%s %s %s: item %d, %s", verb, ev.Kind(), ev.EventID, view.Item.ID, view.Item.State)
			if view.Item.QuarantineReason != nil {
				line += " " + string(*view.Item.QuarantineReason)
			}
			fmt.Fprintln(cmd.OutOrStdout(), line)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&tenant, "tenant", "", "tenant (required)")
	f.StringVar(&eventID, "event-id", "", "event id, unique per tenant: recording it again is a no-op (required)")
	f.StringVar(&feature, "feature", "", "feature, e.g. api_calls (required)")
	f.Int64Var(&quantity, "quantity", 0, "units (≥ 0 for an event; signed for a correction)")
	f.StringVar(&occurredAt, "occurred-at", "", "when the usage happened, RFC 3339 (default now)")
	f.StringVar(&corrects, "corrects", "", "the event id this correction corrects (makes it a correction)")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	for _, name := range []string{"tenant", "event-id", "feature", "quantity"} {
		_ = cmd.MarkFlagRequired(name)
	}
	return cmd
}
