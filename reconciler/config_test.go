package reconciler

import (
	"errors"
	"strings"
	"testing"

	"github.com/aurora-billing/aurora/shared/config"
)

func TestConfigRanges(t *testing.T) {
	base := map[string]string{"AURORA_STRIPE_API_KEY": "sk_test_abc"}
	tests := []struct {
		name    string
		env     map[string]string
		wantVar string // "" = valid
	}{
		{"defaults", nil, ""},
		{"interval too short", map[string]string{"AURORA_RECONCILER_INTERVAL_SECONDS": "59"}, "AURORA_RECONCILER_INTERVAL_SECONDS"},
		{"interval too long", map[string]string{"AURORA_RECONCILER_INTERVAL_SECONDS": "86401"}, "AURORA_RECONCILER_INTERVAL_SECONDS"},
		{"settle lag zero", map[string]string{"AURORA_RECONCILER_SETTLE_LAG_SECONDS": "0"}, ""},
		{"settle lag negative", map[string]string{"AURORA_RECONCILER_SETTLE_LAG_SECONDS": "-1"}, "AURORA_RECONCILER_SETTLE_LAG_SECONDS"},
		{"settle lag above horizon: the lag was set, the lag is named", map[string]string{"AURORA_RECONCILER_SETTLE_LAG_SECONDS": "172800"},
			"config: AURORA_RECONCILER_SETTLE_LAG_SECONDS=172800 (set) leaves AURORA_RECONCILER_CONFIRM_HORIZON_SECONDS=172800 (its default) out of range: it must be at least AURORA_RECONCILER_SETTLE_LAG_SECONDS + 3600 = 176400"},
		{"horizon below lag: the horizon was set", map[string]string{"AURORA_RECONCILER_CONFIRM_HORIZON_SECONDS": "5000"},
			"config: AURORA_RECONCILER_CONFIRM_HORIZON_SECONDS=5000 (set) must be at least AURORA_RECONCILER_SETTLE_LAG_SECONDS + 3600 = 7200 (AURORA_RECONCILER_SETTLE_LAG_SECONDS=3600 (its default))"},
		{"lookback over 35 days", map[string]string{"AURORA_RECONCILER_LOOKBACK_HOURS": "841"}, "AURORA_RECONCILER_LOOKBACK_HOURS"},
		{"rps zero", map[string]string{"AURORA_RECONCILER_REQUESTS_PER_SECOND": "0"}, "AURORA_RECONCILER_REQUESTS_PER_SECOND"},
		{"rps malformed", map[string]string{"AURORA_RECONCILER_REQUESTS_PER_SECOND": "fast"}, "AURORA_RECONCILER_REQUESTS_PER_SECOND"},
		{"bad addr", map[string]string{"AURORA_RECONCILER_HTTP_ADDR": "nowhere"}, "AURORA_RECONCILER_HTTP_ADDR"},
		{"no key", map[string]string{"AURORA_STRIPE_API_KEY": ""}, "AURORA_STRIPE_API_KEY"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := map[string]string{}
			for k, v := range base {
				env[k] = v
			}
			for k, v := range tt.env {
				env[k] = v
			}
			var cfg Config
			err := config.LoadFrom(&cfg, env)
			if tt.wantVar == "" {
				if err != nil {
					t.Fatalf("want valid, got %v", err)
				}
				if strings.Contains(cfg.String(), "sk_test_abc") {
					t.Fatalf("String() shows the key: %s", cfg.String())
				}
				return
			}
			if !errors.Is(err, config.ErrInvalid) || !strings.Contains(err.Error(), tt.wantVar) {
				t.Fatalf("want an error naming %s, got %v", tt.wantVar, err)
			}
		})
	}
}

func TestKindsValid(t *testing.T) {
	if len(Kinds) != 10 {
		t.Fatalf("want ten kinds, got %d", len(Kinds))
	}
	for _, k := range Kinds {
		if !k.Valid() {
			t.Fatalf("%s not valid", k)
		}
	}
	if Kind("nope").Valid() {
		t.Fatal("unknown kind valid")
	}
}

// An unset key is "required" and shown "(unset)", never "(redacted)"; a
// set one is never shown.
func TestAPIKeyShownSetOrUnset(t *testing.T) {
	var cfg Config
	err := config.LoadFrom(&cfg, map[string]string{"AURORA_STRIPE_API_KEY": ""})
	if err == nil || !strings.Contains(err.Error(), "config: AURORA_STRIPE_API_KEY is required; allowed a key starting sk_test_") {
		t.Fatalf("unset key: %v", err)
	}
	if s := cfg.String(); !strings.Contains(s, "stripe_api_key=(unset)") {
		t.Fatalf("unset key shown as: %s", s)
	}
	err = config.LoadFrom(&cfg, map[string]string{"AURORA_STRIPE_API_KEY": "pk_test_wrong"})
	if err == nil || !strings.Contains(err.Error(), "AURORA_STRIPE_API_KEY=(set, redacted) is out of range") || strings.Contains(err.Error(), "wrong") {
		t.Fatalf("wrong key: %v", err)
	}
	if err := config.LoadFrom(&cfg, map[string]string{"AURORA_STRIPE_API_KEY": "sk_test_abc"}); err != nil {
		t.Fatal(err)
	}
	if s := cfg.String(); !strings.Contains(s, "stripe_api_key=(set, redacted)") || strings.Contains(s, "sk_test_abc") {
		t.Fatalf("set key shown as: %s", s)
	}
}
