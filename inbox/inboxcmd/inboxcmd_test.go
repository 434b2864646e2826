package inboxcmd

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/aurora-billing/aurora/shared/config"
)

func TestValidate(t *testing.T) {
	tests := []struct {
		env     map[string]string
		wantErr string
	}{
		{map[string]string{"AURORA_STRIPE_WEBHOOK_SECRET": "whsec_a,whsec_b"}, ""},
		{map[string]string{"AURORA_STRIPE_WEBHOOK_SECRET": ""}, "AURORA_STRIPE_WEBHOOK_SECRET"},
		{map[string]string{"AURORA_STRIPE_WEBHOOK_SECRET": "whsec_a", "AURORA_INBOX_POLL_MS": "100"}, "AURORA_INBOX_POLL_MS"},
		{map[string]string{"AURORA_STRIPE_WEBHOOK_SECRET": "whsec_a", "AURORA_INBOX_BATCH_SIZE": "100"}, "AURORA_INBOX_BATCH_SIZE"},
	}
	for _, tc := range tests {
		for _, k := range []string{"AURORA_STRIPE_WEBHOOK_SECRET", "AURORA_INBOX_POLL_MS", "AURORA_INBOX_BATCH_SIZE"} {
			t.Setenv(k, tc.env[k])
		}
		cmd := New("inbox")
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs([]string{"--validate"})
		err := cmd.ExecuteContext(context.Background())
		if tc.wantErr == "" {
			if err != nil || !strings.Contains(out.String(), "configuration valid") || strings.Contains(out.String(), "whsec_") {
				t.Errorf("%v: %v %q", tc.env, err, out.String())
			}
			continue
		}
		if !errors.Is(err, config.ErrInvalid) || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%v: %v, want an error naming %s", tc.env, err, tc.wantErr)
		}
	}
}
