package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/aurora-billing/aurora/provision"
	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	"github.com/stripe/stripe-go/v76/client"
)

func openPool(cmd *cobra.Command) (*pgxpool.Pool, error) {
	url, err := sessionURL()
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.New(cmd.Context(), url)
	if err != nil {
		return nil, &ExitError{Code: ExitInvalidInput, Msg: "AURORA_DATABASE_URL is not a valid Postgres URL: " + err.Error(), Err: err}
	}
	if err := pool.Ping(cmd.Context()); err != nil {
		pool.Close()
		return nil, &ExitError{Code: ExitFailure, Msg: "cannot reach the database at AURORA_DATABASE_URL; check it is up and the URL is right", Err: err}
	}
	return pool, nil
}

func stripeAPI() (*client.API, error) {
	key := os.Getenv("AURORA_STRIPE_API_KEY")
	if !strings.HasPrefix(key, "sk_") && !strings.HasPrefix(key, "rk_") {
		return nil, invalidInput("set AURORA_STRIPE_API_KEY to a Stripe secret key (sk_test_… for test mode)")
	}
	return provision.NewAPI(key, os.Getenv("AURORA_STRIPE_API_BASE"), nil), nil
}

func newProvisionCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "provision",
		Short: "Set up the destination account, meters (feature mappings) and tenant customers",
		Long: `Set up what usage export needs. Each command is idempotent.

  account   record the destination Stripe account, its mode and whether it is confirmed
  meter     map a feature to a Stripe meter (created, or an existing one adopted); shows what a
            remap does to staged items and writes only with --yes
  customer  create a Stripe customer for a tenant and link them

meter and customer call Stripe with AURORA_STRIPE_API_KEY (and AURORA_STRIPE_API_BASE,
e.g. the emulator's URL).`,
	}
	var asJSON bool
	cmd.PersistentFlags().BoolVar(&asJSON, "json", false, "print JSON")
	out := func(cmd *cobra.Command, v any, text string) error {
		if asJSON {
			return json.NewEncoder(cmd.OutOrStdout()).Encode(v)
		}
		_, err := fmt.Fprintln(cmd.OutOrStdout(), text)
		return err
	}

	var account, mode, exporter string
	var confirmed bool
	acct := &cobra.Command{
		Use:   "account",
		Short: "Record the destination account (--account acct_… --mode test|live [--confirmed])",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !identity.Mode(mode).Valid() {
				return invalidInput("--mode must be test or live")
			}
			if !slices.Contains(provision.Exporters, exporter) {
				return invalidInput("--exporter must be v1 or stream")
			}
			pool, err := openPool(cmd)
			if err != nil {
				return err
			}
			defer pool.Close()
			if err := provision.Account(cmd.Context(), pool, account, identity.Mode(mode), confirmed); err != nil {
				return provisionErr(err)
			}
			// A new account gets v1 unless --exporter says otherwise; an
			// existing one keeps its exporter unless --exporter is given.
			if cmd.Flags().Changed("exporter") {
				if err := provision.SetExporter(cmd.Context(), pool, account, exporter); err != nil {
					return provisionErr(err)
				}
			} else if err := pool.QueryRow(cmd.Context(), `SELECT exporter FROM stripe_accounts WHERE account_id = $1`, account).Scan(&exporter); err != nil {
				return fmt.Errorf("provision account: %w", err)
			}
			return out(cmd, map[string]any{"account": account, "mode": mode, "confirmed": confirmed, "exporter": exporter},
				fmt.Sprintf("account %s mode=%s confirmed=%v exporter=%s", account, mode, confirmed, exporter))
		},
	}
	acct.Flags().StringVar(&account, "account", "", "Stripe account id (required)")
	acct.Flags().StringVar(&mode, "mode", "test", "test|live")
	acct.Flags().BoolVar(&confirmed, "confirmed", false, "an operator has confirmed this account")
	acct.Flags().StringVar(&exporter, "exporter", "v1", "v1|stream: one meter event call per item, or Stripe's v2 meter event stream (batches of up to 100); an existing account keeps its own unless given")
	_ = acct.MarkFlagRequired("account")

	meter := newProvisionMeterCmd(&asJSON)

	var tenant string
	customer := &cobra.Command{
		Use:   "customer",
		Short: "Create a Stripe customer for a tenant and link it (--account --tenant)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			api, err := stripeAPI()
			if err != nil {
				return err
			}
			pool, err := openPool(cmd)
			if err != nil {
				return err
			}
			defer pool.Close()
			id, created, err := provision.Customer(cmd.Context(), pool, api, account, tenant)
			if err != nil {
				return provisionErr(err)
			}
			// The customer id is printed to the operator who asked for it; it is never logged.
			return out(cmd, map[string]any{"tenant": tenant, "stripe_customer": id, "created": created},
				fmt.Sprintf("tenant %s → customer %s (created=%v)", tenant, id, created))
		},
	}
	customer.Flags().StringVar(&account, "account", "", "Stripe account id (required)")
	customer.Flags().StringVar(&tenant, "tenant", "", "tenant (required)")
	_ = customer.MarkFlagRequired("account")
	_ = customer.MarkFlagRequired("tenant")

	cmd.AddCommand(acct, meter, customer)
	return cmd
}

func provisionErr(err error) error {
	if errors.Is(err, provision.ErrInvalid) {
		return &ExitError{Code: ExitInvalidInput, Msg: err.Error(), Err: err}
	}
	return err
}
