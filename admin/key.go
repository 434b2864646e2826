package admin

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/spf13/cobra"
)

func newKeyCmd() *cobra.Command {
	var tenant, kind, ref, account string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "key",
		Short: "Print the idempotency key (the Stripe identifier) of an identity",
		Long: `Print the idempotency key: lowercase hex SHA-256 over tenant, subject kind,
subject ref and destination account, each as a 4-byte big-endian length and its
UTF-8 bytes. It is the meter event identifier and Idempotency-Key to search
for in Stripe's dashboard and request logs.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			id := identity.Identity{Tenant: tenant, SubjectKind: identity.SubjectKind(kind), SubjectRef: ref,
				DestinationAccount: account, Exporter: "-", Mode: identity.ModeTest}
			if err := id.Validate(); err != nil {
				var fe *identity.FieldError
				if errors.As(err, &fe) {
					return invalidInput("--%s: %s", flagName(fe.Field), fe.Reason)
				}
				return invalidInput("%v", err)
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(map[string]string{"key": id.Key()})
			}
			_, err := fmt.Fprintln(cmd.OutOrStdout(), id.Key())
			return err
		},
	}
	cmd.Flags().StringVar(&tenant, "tenant", "", "tenant (required)")
	cmd.Flags().StringVar(&kind, "subject-kind", "", "usage_window|event|correction (required)")
	cmd.Flags().StringVar(&ref, "subject-ref", "", "subject reference, e.g. usage:api_calls:2026-09-01T00:00:00Z:0:5 (required)")
	cmd.Flags().StringVar(&account, "destination-account", "", "Stripe account, e.g. acct_1Test (required)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print {\"key\": …}")
	for _, f := range []string{"tenant", "subject-kind", "subject-ref", "destination-account"} {
		_ = cmd.MarkFlagRequired(f)
	}
	return cmd
}

func flagName(field string) string {
	out := []byte(field)
	for i, c := range out {
		if c == '_' {
			out[i] = '-'
		}
	}
	return string(out)
}
