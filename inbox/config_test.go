package inbox

import (
	"errors"
	"strings"
	"testing"

	"github.com/aurora-billing/aurora/shared/config"
)

func TestConfigRanges(t *testing.T) {
	t.Parallel()
	base := func() map[string]string {
		return map[string]string{"AURORA_STRIPE_WEBHOOK_SECRET": "whsec_a, whsec_b"}
	}
	var ok Config
	if err := config.LoadFrom(&ok, base()); err != nil {
		t.Fatal(err)
	}
	if ok.PollMS != 5000 || ok.BatchSize != 10 || ok.Addr != ":8090" || len(ok.Secrets()) != 2 {
		t.Fatalf("defaults %+v", ok)
	}
	if s := ok.String(); strings.Contains(s, "whsec_") {
		t.Fatalf("secrets in String(): %s", s)
	}
	tests := []struct {
		key, value, names string
	}{
		{"AURORA_INBOX_POLL_MS", "999", "AURORA_INBOX_POLL_MS"},
		{"AURORA_INBOX_POLL_MS", "60001", "AURORA_INBOX_POLL_MS"},
		{"AURORA_INBOX_POLL_MS", "fast", "AURORA_INBOX_POLL_MS"},
		{"AURORA_INBOX_BATCH_SIZE", "0", "AURORA_INBOX_BATCH_SIZE"},
		{"AURORA_INBOX_BATCH_SIZE", "26", "AURORA_INBOX_BATCH_SIZE"},
		{"AURORA_STRIPE_WEBHOOK_SECRET", " , ", "AURORA_STRIPE_WEBHOOK_SECRET"},
		{"AURORA_DATABASE_URL", "mysql://x/y", "AURORA_DATABASE_URL"},
		{"AURORA_INBOX_ADDR", " ", "AURORA_INBOX_ADDR"},
	}
	for _, tc := range tests {
		env := base()
		env[tc.key] = tc.value
		var c Config
		err := config.LoadFrom(&c, env)
		var re *config.RangeError
		if !errors.Is(err, config.ErrInvalid) || !errors.As(err, &re) || !strings.Contains(err.Error(), tc.names) {
			t.Errorf("%s=%q: %v", tc.key, tc.value, err)
		}
	}
	for _, edge := range [][2]string{{"AURORA_INBOX_POLL_MS", "1000"}, {"AURORA_INBOX_POLL_MS", "60000"}, {"AURORA_INBOX_BATCH_SIZE", "1"}, {"AURORA_INBOX_BATCH_SIZE", "25"}} {
		env := base()
		env[edge[0]] = edge[1]
		var c Config
		if err := config.LoadFrom(&c, env); err != nil {
			t.Errorf("%s=%s: %v", edge[0], edge[1], err)
		}
	}
}

func TestBackoffSeconds(t *testing.T) {
	t.Parallel()
	want := []int{60, 120, 240, 480, 960, 1920, 3600, 3600, 3600, 3600, 3600, 3600}
	for i, w := range want {
		if got := BackoffSeconds(i + 1); got != w {
			t.Errorf("attempt %d: %d, want %d", i+1, got, w)
		}
	}
}

func TestEveryReasonIsClassified(t *testing.T) {
	t.Parallel()
	seen := map[Reason]bool{}
	for _, r := range Reasons {
		_ = r.Deferred() // panics on an unclassified reason
		if seen[r] {
			t.Fatalf("duplicate %s", r)
		}
		seen[r] = true
	}
	// the seed's codes, verbatim
	for _, code := range []string{"customer_not_linked", "subscription_not_linked", "unmapped_stripe_price", "stripe_price_config_missing",
		"unrecognized_stripe_payload", "ambiguous_invoice_order", "ambiguous_subscription_order", "ambiguous_multi_subscription",
		"ambiguous_invoice_subscription", "ambiguous_customer_linkage"} {
		if !seen[Reason(code)] {
			t.Errorf("seed reason %s has no constant", code)
		}
	}
}
