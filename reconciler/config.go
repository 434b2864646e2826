package reconciler

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aurora-billing/aurora/shared/config"
)

// Defaults and ranges of the reconciler's knobs (AURORA_RECONCILER_*).
const (
	// HTTPAddrDefault: /healthz, /readyz, /metrics.
	HTTPAddrDefault = "127.0.0.1:9105"
	// IntervalDefault: one provider run every 15 minutes (60..86400 s).
	IntervalDefault = 15 * time.Minute
	// SettleLagDefault: a summary window is compared only once its end is
	// this far in the past (0..172800 s). Stripe says its summaries are
	// eventually consistent and publishes no lag figure; an hour is ours,
	// chosen well above the minutes observed in test mode and far below
	// the invoice grace period's deadline. A younger window is unsettled,
	// never missing.
	SettleLagDefault = time.Hour
	// LookbackDefault: windows up to 72 hours back are compared on every
	// run (1..840 h; 840 h is Stripe's 35-day timestamp window).
	LookbackDefault = 72 * time.Hour
	// ConfirmHorizonDefault: an item accepted this long ago and still not
	// confirmed is an unconfirmed_acceptance (at least settle lag + 1 h, at
	// most 35 days). 48 h: two days of windows had the chance to settle.
	ConfirmHorizonDefault = 48 * time.Hour
	// RequestsPerSecondDefault paces provider calls: 20 per second, under
	// Stripe's test-mode basic limit of 25/s (live mode allows more;
	// 1..100).
	RequestsPerSecondDefault = 20
)

// Config is the reconciler service's configuration, loaded with
// config.Load.
type Config struct {
	// HTTPAddr: listen address of /healthz, /readyz and /metrics.
	// AURORA_RECONCILER_HTTP_ADDR, default 127.0.0.1:9105; empty turns it off.
	HTTPAddr string `env:"RECONCILER_HTTP_ADDR" envDefault:"127.0.0.1:9105"`
	// IntervalSeconds: time between provider runs.
	// AURORA_RECONCILER_INTERVAL_SECONDS, default 900, 60..86400.
	IntervalSeconds int `env:"RECONCILER_INTERVAL_SECONDS" envDefault:"900"`
	// SettleLagSeconds: see SettleLagDefault.
	// AURORA_RECONCILER_SETTLE_LAG_SECONDS, default 3600, 0..172800.
	SettleLagSeconds int `env:"RECONCILER_SETTLE_LAG_SECONDS" envDefault:"3600"`
	// LookbackHours: see LookbackDefault.
	// AURORA_RECONCILER_LOOKBACK_HOURS, default 72, 1..840.
	LookbackHours int `env:"RECONCILER_LOOKBACK_HOURS" envDefault:"72"`
	// ConfirmHorizonSeconds: see ConfirmHorizonDefault.
	// AURORA_RECONCILER_CONFIRM_HORIZON_SECONDS, default 172800,
	// settle lag + 3600 .. 3024000.
	ConfirmHorizonSeconds int `env:"RECONCILER_CONFIRM_HORIZON_SECONDS" envDefault:"172800"`
	// RequestsPerSecond: provider calls per second, at most.
	// AURORA_RECONCILER_REQUESTS_PER_SECOND, default 20, 1..100.
	RequestsPerSecond int `env:"RECONCILER_REQUESTS_PER_SECOND" envDefault:"20"`
	// Stripe: AURORA_STRIPE_API_KEY (required; never printed) and
	// AURORA_STRIPE_API_BASE (default https://api.stripe.com).
	Stripe StripeConfig
	// Export: AURORA_STRIPE_ACCOUNT, the destination account reconciled
	// (the key's account), and its mode.
	Export config.Export
	// Database: AURORA_DATABASE_URL.
	Database config.Database
}

// StripeConfig is the Stripe client's configuration.
type StripeConfig struct {
	// APIKey: AURORA_STRIPE_API_KEY. Never logged or printed.
	APIKey string `env:"STRIPE_API_KEY"`
	// APIBase: AURORA_STRIPE_API_BASE, default https://api.stripe.com.
	APIBase string `env:"STRIPE_API_BASE" envDefault:"https://api.stripe.com"`
}

// Validate checks the key's shape (its value is never included) and the URL.
func (s StripeConfig) Validate() error {
	var key error
	ok := false
	for _, p := range []string{"sk_test_", "rk_test_", "sk_live_", "rk_live_"} {
		ok = ok || (strings.HasPrefix(s.APIKey, p) && len(s.APIKey) > len(p))
	}
	if !ok {
		shown := "" // unset: "is required"
		if s.APIKey != "" {
			shown = "(set, redacted)"
		}
		key = &config.RangeError{Var: config.Prefix + "STRIPE_API_KEY", Value: shown, Allowed: "a key starting sk_test_, rk_test_, sk_live_ or rk_live_"}
	}
	return errors.Join(key, config.URL("STRIPE_API_BASE", s.APIBase, "http", "https"))
}

// Validate names every bad variable and its allowed range; each error is a
// *config.RangeError wrapping config.ErrInvalid.
func (c *Config) Validate() error {
	lag := config.IntRange("RECONCILER_SETTLE_LAG_SECONDS", c.SettleLagSeconds, 0, 172800, "seconds")
	horizon := config.IntRange("RECONCILER_CONFIRM_HORIZON_SECONDS", c.ConfirmHorizonSeconds, 3600, 3024000, "seconds")
	if lag == nil && horizon == nil {
		horizon = config.RelationBound("RECONCILER_CONFIRM_HORIZON_SECONDS", c.ConfirmHorizonSeconds, ">=", c.SettleLagSeconds+3600,
			config.Prefix+"RECONCILER_SETTLE_LAG_SECONDS + 3600", "RECONCILER_SETTLE_LAG_SECONDS", c.SettleLagSeconds,
			"an acceptance is confirmed only after its window settled")
	}
	return errors.Join(
		config.ListenAddr("RECONCILER_HTTP_ADDR", c.HTTPAddr, true),
		config.IntRange("RECONCILER_INTERVAL_SECONDS", c.IntervalSeconds, 60, 86400, "seconds"),
		lag,
		config.IntRange("RECONCILER_LOOKBACK_HOURS", c.LookbackHours, 1, 840, "hours"),
		horizon,
		config.IntRange("RECONCILER_REQUESTS_PER_SECOND", c.RequestsPerSecond, 1, 100, "calls per second"),
		c.Stripe.Validate(),
		c.Export.Validate(),
		c.Database.Validate(),
	)
}

// Options returns the knobs as Options for New.
func (c *Config) Options() Options {
	return Options{
		Account:           c.Export.StripeAccount,
		SettleLag:         time.Duration(c.SettleLagSeconds) * time.Second,
		Lookback:          time.Duration(c.LookbackHours) * time.Hour,
		ConfirmHorizon:    time.Duration(c.ConfirmHorizonSeconds) * time.Second,
		RequestsPerSecond: c.RequestsPerSecond,
	}
}

// Interval returns IntervalSeconds as a duration.
func (c *Config) Interval() time.Duration { return time.Duration(c.IntervalSeconds) * time.Second }

// secretShown is how String shows a secret: "(set, redacted)" or
// "(unset)", never its value.
func secretShown(v string) string {
	if strings.TrimSpace(v) == "" {
		return "(unset)"
	}
	return "(set, redacted)"
}

// String describes the configuration without secrets or credentials.
func (c *Config) String() string {
	return fmt.Sprintf("http_addr=%s interval_seconds=%d settle_lag_seconds=%d lookback_hours=%d confirm_horizon_seconds=%d requests_per_second=%d stripe_api_key=%s stripe_api_base=%s stripe_account=%s stripe_mode=%s database=%s",
		c.HTTPAddr, c.IntervalSeconds, c.SettleLagSeconds, c.LookbackHours, c.ConfirmHorizonSeconds, c.RequestsPerSecond, secretShown(c.Stripe.APIKey),
		config.RedactURL(c.Stripe.APIBase), c.Export.StripeAccount, c.Export.StripeMode, config.RedactURL(c.Database.URL))
}
