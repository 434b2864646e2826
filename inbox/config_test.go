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

// Each comma-separated AURORA_STRIPE_WEBHOOK_SECRET must be of Stripe's
// whsec_… shape: the inbox refuses to start naming the variable and the
// shape, never echoing the secret; an unset one is "required".
func TestWebhookSecretShape(t *testing.T) {
	t.Parallel()
	tests := []struct {
		value string
		want  string // "" = valid
	}{
		{"whsec_abc123", ""},
		{"whsec_test_inbox_current", ""},
		{"whsec_old1,whsec_new2", ""},
		{"whsec_old1, whsec_new2 ,", ""},
		{"", "config: AURORA_STRIPE_WEBHOOK_SECRET is required; allowed one or more Stripe endpoint signing secrets whsec_…"},
		{"sk_test_oops", "AURORA_STRIPE_WEBHOOK_SECRET=(entry 1 of 1, redacted: does not start with whsec_) is out of range; allowed one or more Stripe endpoint signing secrets whsec_…"},
		{"notawhsec", "(entry 1 of 1, redacted: does not start with whsec_)"},
		{"whsec_ok1,sk_test_oops", "(entry 2 of 2, redacted: does not start with whsec_)"},
		{"whsec_", "(entry 1 of 1, redacted: has nothing or other than letters, digits and _ after whsec_)"},
		{"whsec_a b", "redacted: has nothing or other"},
	}
	for _, tc := range tests {
		var c Config
		err := config.LoadFrom(&c, map[string]string{"AURORA_STRIPE_WEBHOOK_SECRET": tc.value})
		if tc.want == "" {
			if err != nil {
				t.Errorf("%q: %v", tc.value, err)
			}
			continue
		}
		var re *config.RangeError
		if !errors.As(err, &re) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.value, err, tc.want)
		}
		if err != nil && (strings.Contains(err.Error(), "oops") || strings.Contains(err.Error(), "notawhsec")) {
			t.Errorf("%q: the secret reached the message: %v", tc.value, err)
		}
	}
}
