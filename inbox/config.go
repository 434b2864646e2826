package inbox

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aurora-billing/aurora/shared/config"
)

// Defaults and ranges of the inbox knobs (seed 003: poll 1,000–60,000 ms,
// default 5,000; batch 1–25, default 10).
const (
	AddrDefault      = ":8090"
	PollMSDefault    = 5000
	PollMSMin        = 1000
	PollMSMax        = 60000
	BatchSizeDefault = 10
	BatchSizeMin     = 1
	BatchSizeMax     = 25
)

// Config is the inbox service's configuration, loaded from AURORA_*
// variables with config.Load.
type Config struct {
	// Addr: listen address of POST /webhooks/stripe, /healthz, /readyz and
	// /metrics. AURORA_INBOX_ADDR; defaults to ":8090".
	Addr string `env:"INBOX_ADDR" envDefault:":8090"`
	// WebhookSecrets: the Stripe endpoint signing secrets (whsec_…); several,
	// comma-separated, during a rotation. AURORA_STRIPE_WEBHOOK_SECRET;
	// required.
	WebhookSecrets []string `env:"STRIPE_WEBHOOK_SECRET" envSeparator:","`
	// PollMS: worker poll interval in milliseconds. AURORA_INBOX_POLL_MS;
	// defaults to 5000, 1000..60000.
	PollMS int `env:"INBOX_POLL_MS" envDefault:"5000"`
	// BatchSize: events per worker pass. AURORA_INBOX_BATCH_SIZE; defaults
	// to 10, 1..25.
	BatchSize int `env:"INBOX_BATCH_SIZE" envDefault:"10"`
	// Database: AURORA_DATABASE_URL.
	Database config.Database
}

// Validate names the first bad variable and its allowed range; every error
// is a *config.RangeError wrapping config.ErrInvalid.
func (c *Config) Validate() error {
	secrets := c.Secrets()
	var secErr error
	if len(secrets) == 0 {
		secErr = &config.RangeError{Var: config.Prefix + "STRIPE_WEBHOOK_SECRET", Value: "", Allowed: "one or more signing secrets, comma-separated"}
	}
	return errors.Join(
		config.ListenAddr("INBOX_ADDR", c.Addr, false),
		secErr,
		config.IntRange("INBOX_POLL_MS", c.PollMS, PollMSMin, PollMSMax, "milliseconds"),
		config.IntRange("INBOX_BATCH_SIZE", c.BatchSize, BatchSizeMin, BatchSizeMax, "events per pass"),
		c.Database.Validate(),
	)
}

// Secrets returns the non-empty, trimmed signing secrets.
func (c *Config) Secrets() []string {
	out := make([]string, 0, len(c.WebhookSecrets))
	for _, s := range c.WebhookSecrets {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// Poll returns PollMS as a duration.
func (c *Config) Poll() time.Duration { return time.Duration(c.PollMS) * time.Millisecond }

// String describes the configuration without secrets or credentials.
func (c *Config) String() string {
	return fmt.Sprintf("addr=%s stripe_webhook_secrets=%d(redacted) poll_ms=%d batch_size=%d database=%s",
		c.Addr, len(c.Secrets()), c.PollMS, c.BatchSize, redactURL(c.Database.URL))
}
