package provision

import (
	"errors"
	"fmt"

	"github.com/aurora-billing/aurora/shared/field"
)

// ErrInvalid: bad input (an account, feature, event name or tenant that
// fails the field rules, an unknown mode); see *FieldError.
var ErrInvalid = errors.New("provision: invalid input")

// FieldError names the argument that failed validation (account, feature,
// event_name, tenant, mode). It wraps ErrInvalid.
type FieldError struct {
	Field  string
	Reason string
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("provision: invalid %s: %s", e.Field, e.Reason)
}

// Unwrap returns ErrInvalid.
func (e *FieldError) Unwrap() error { return ErrInvalid }

// checkAccount: a Stripe account id (field.Text, field.MaxStripeIDBytes).
func checkAccount(account string) error {
	if r := field.Text(account, field.MaxStripeIDBytes); r != "" {
		return &FieldError{Field: "account", Reason: r}
	}
	return nil
}

// checkTenant: a tenant is text of at most field.MaxTenantBytes, and it is
// sent as the customer's metadata value aurora_tenant (Stripe: at most 500
// characters).
func checkTenant(tenant string) error {
	if r := field.Text(tenant, field.MaxTenantBytes); r != "" {
		return &FieldError{Field: "tenant", Reason: r}
	}
	if r := field.MetadataValue(tenant); r != "" {
		return &FieldError{Field: "tenant", Reason: r}
	}
	return nil
}
