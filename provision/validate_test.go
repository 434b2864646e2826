package provision

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/aurora-billing/aurora/shared/identity"
)

// Bad arguments are refused with a *FieldError naming them before any
// database or Stripe call (pool and API are nil here).
func TestProvisionRefusesBadArgumentsNamingThem(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	long := strings.Repeat("t", 300)
	tests := []struct {
		name, field string
		call        func() error
	}{
		{"account with NUL", "account", func() error { return Account(ctx, nil, "acct_\x00", identity.ModeTest, true) }},
		{"empty account", "account", func() error { return Account(ctx, nil, "", identity.ModeTest, true) }},
		{"unknown mode", "mode", func() error { return Account(ctx, nil, "acct_1", "prod", true) }},
		{"feature with a space", "feature", func() error { _, err := Meter(ctx, nil, nil, "acct_1", "api calls", "e"); return err }},
		{"event name with NUL", "event_name", func() error { _, err := Meter(ctx, nil, nil, "acct_1", "api_calls", "e\x00"); return err }},
		{"300-character tenant", "tenant", func() error { _, _, err := Customer(ctx, nil, nil, "acct_1", long); return err }},
		{"NUL tenant", "tenant", func() error { _, _, err := Customer(ctx, nil, nil, "acct_1", "org_\x00b"); return err }},
		{"invalid UTF-8 tenant", "tenant", func() error { _, _, err := Customer(ctx, nil, nil, "acct_1", "org_\xff"); return err }},
		{"account with a newline", "account", func() error { _, _, err := Customer(ctx, nil, nil, "acct\n1", "org_1"); return err }},
	}
	for _, tt := range tests {
		err := tt.call()
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != tt.field || !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want *FieldError for %s wrapping ErrInvalid", tt.name, err, tt.field)
		}
	}
}
