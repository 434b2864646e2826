// Package provision sets up what a deployment needs before usage can be
// sent: the destination Stripe account (with its mode and a confirmed
// flag), a Stripe meter per feature with the matching meter_mappings row,
// and a Stripe customer per tenant with its tenant_billing row.
//
// These are the code paths an operator uses (auroractl provision …) and the
// demo uses against the emulator. Each call is idempotent: an existing
// mapping or customer is reused, never created twice.
package provision

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/aurora-billing/aurora/shared/field"
	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/client"
)

// Payload keys aurora's meters use: the meter event payload carries the
// customer under CustomerKey and the quantity under ValueKey.
const (
	CustomerKey = "stripe_customer_id"
	ValueKey    = "value"
)

// NewAPI returns a stripe-go client for key at baseURL ("" = Stripe's own
// API). Library retries are off: callers own their retry policy.
func NewAPI(key, baseURL string, httpClient *http.Client) *client.API {
	cfg := &stripe.BackendConfig{MaxNetworkRetries: stripe.Int64(0), LeveledLogger: &stripe.LeveledLogger{Level: stripe.LevelNull}}
	if baseURL != "" {
		cfg.URL = stripe.String(strings.TrimRight(baseURL, "/"))
	}
	if httpClient != nil {
		cfg.HTTPClient = httpClient
	}
	api := &client.API{}
	api.Init(key, &stripe.Backends{
		API:     stripe.GetBackendWithConfig(stripe.APIBackend, cfg),
		Connect: stripe.GetBackendWithConfig(stripe.ConnectBackend, cfg),
		Uploads: stripe.GetBackendWithConfig(stripe.UploadsBackend, cfg),
	})
	return api
}

// Account records the destination account (a *FieldError, ErrInvalid, for
// an account id that fails field.Text or a mode other than test|live), its mode and whether an
// operator confirmed it (unconfirmed accounts quarantine their items with
// account_unconfirmed).
func Account(ctx context.Context, pool *pgxpool.Pool, accountID string, mode identity.Mode, confirmed bool) error {
	if err := checkAccount(accountID); err != nil {
		return err
	}
	if !mode.Valid() {
		return &FieldError{Field: "mode", Reason: "must be test or live"}
	}
	_, err := pool.Exec(ctx, `
		INSERT INTO stripe_accounts (account_id, mode, confirmed, confirmed_at)
		VALUES ($1, $2, $3, CASE WHEN $3 THEN now() END)
		ON CONFLICT (account_id) DO UPDATE SET mode = EXCLUDED.mode, confirmed = EXCLUDED.confirmed,
			confirmed_at = CASE WHEN EXCLUDED.confirmed THEN coalesce(stripe_accounts.confirmed_at, now()) END,
			updated_at = now()`, accountID, string(mode), confirmed)
	if err != nil {
		return fmt.Errorf("provision: account: %w", err)
	}
	return nil
}

// Exporters a destination account can choose (stripe_accounts.exporter,
// migration 00306): "v1" (one meter event call per item, the default) or
// "stream" (the v2 meter event stream, batches of up to 100).
var Exporters = []string{"v1", "stream"}

// SetExporter chooses the exporter of an existing account (a *FieldError,
// ErrInvalid, for an exporter not in Exporters or a bad account id;
// ErrNotFound-wrapping error for an account not provisioned). Items already
// accepted keep their key; the next claim of each pending item uses it.
func SetExporter(ctx context.Context, pool *pgxpool.Pool, accountID, exporter string) error {
	if err := checkAccount(accountID); err != nil {
		return err
	}
	if !slices.Contains(Exporters, exporter) {
		return &FieldError{Field: "exporter", Reason: "must be v1 or stream"}
	}
	tag, err := pool.Exec(ctx, `UPDATE stripe_accounts SET exporter = $2, updated_at = now() WHERE account_id = $1`, accountID, exporter)
	if err != nil {
		return fmt.Errorf("provision: account exporter: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return &FieldError{Field: "account", Reason: "not provisioned"}
	}
	return nil
}

// Mapping is a feature's meter on an account.
type Mapping struct {
	Feature        string `json:"feature"`
	MeterID        string `json:"meter_id"`
	EventName      string `json:"event_name"`
	MappingVersion int32  `json:"mapping_version"`
	Created        bool   `json:"created"` // a meter was created at Stripe by this call
}

// Meter (a *FieldError, ErrInvalid, for a bad account, a feature that is not
// a feature name (field.Feature) or an event name that fails field.Text)
// makes sure feature has a Stripe meter (sum of ValueKey, customer by
// CustomerKey) whose event name is eventName, and a meter_mappings row
// pointing at it: PlanMeter then ApplyMeter, without a dry run. An existing
// mapping with the same event name is reused; an active Stripe meter that
// already records eventName is adopted (Stripe refuses a second one);
// otherwise a meter is created. A different meter than the mapped one bumps
// mapping_version (items built for the old version are then quarantined
// feature_unmapped and refused on requeue with mapping_changed; restage
// them).
func Meter(ctx context.Context, pool *pgxpool.Pool, api *client.API, account, feature, eventName string) (Mapping, error) {
	p, err := planMeter(ctx, pool, api, account, feature, eventName, "", false)
	if err != nil {
		return Mapping{}, err
	}
	m, err := ApplyMeter(ctx, pool, api, p)
	var se *stripe.Error
	if p.Meter == MeterCreate && errors.As(err, &se) && se.HTTPStatusCode == http.StatusBadRequest {
		// The event name may be taken by an active meter: adopt it.
		if p, err2 := planMeter(ctx, pool, api, account, feature, eventName, "", true); err2 == nil && p.Meter != MeterCreate {
			return ApplyMeter(ctx, pool, api, p)
		}
	}
	return m, err
}

// Customer (a *FieldError, ErrInvalid, for a bad account or a tenant that
// fails field.Text within field.MaxTenantBytes) makes sure tenant has a Stripe customer on account and returns
// its id. The customer is created with metadata aurora_tenant=<tenant> and
// an idempotency key derived from (account, tenant), so a crash between the
// Stripe call and the insert cannot create a second customer.
func Customer(ctx context.Context, pool *pgxpool.Pool, api *client.API, account, tenant string) (string, bool, error) {
	if err := checkAccount(account); err != nil {
		return "", false, err
	}
	if err := checkTenant(tenant); err != nil {
		return "", false, err
	}
	var existing *string
	err := pool.QueryRow(ctx, `SELECT stripe_customer FROM tenant_billing WHERE tenant = $1 AND destination_account = $2`, tenant, account).Scan(&existing)
	if err == nil && existing != nil {
		return *existing, false, nil
	}
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return "", false, fmt.Errorf("provision: customer: %w", err)
	}
	params := &stripe.CustomerParams{Metadata: map[string]string{"aurora_tenant": tenant}}
	params.SetIdempotencyKey("aurora-customer-" + identity.Key(tenant, identity.SubjectEvent, "customer", account))
	cus, err := api.Customers.New(params)
	if err != nil {
		return "", false, fmt.Errorf("provision: create customer: %w", err)
	}
	if r := field.Text(cus.ID, field.MaxStripeIDBytes); r != "" {
		return "", false, fmt.Errorf("provision: create customer: Stripe answered a customer id that cannot be stored: %s", r)
	}
	_, err = pool.Exec(ctx, `
		INSERT INTO tenant_billing (tenant, destination_account, stripe_customer) VALUES ($1, $2, $3)
		ON CONFLICT (tenant, destination_account) DO UPDATE SET stripe_customer = EXCLUDED.stripe_customer, updated_at = now()`,
		tenant, account, cus.ID)
	if err != nil {
		return "", false, fmt.Errorf("provision: tenant billing: %w", err)
	}
	return cus.ID, true, nil
}
