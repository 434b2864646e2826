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
	secErr := validSecrets(c.Secrets())
	return errors.Join(
		config.ListenAddr("INBOX_ADDR", c.Addr, false),
		secErr,
		config.IntRange("INBOX_POLL_MS", c.PollMS, PollMSMin, PollMSMax, "milliseconds"),
		config.IntRange("INBOX_BATCH_SIZE", c.BatchSize, BatchSizeMin, BatchSizeMax, "events per pass"),
		c.Database.Validate(),
	)
}

// webhookSecretShape is what AURORA_STRIPE_WEBHOOK_SECRET must hold.
const webhookSecretShape = "one or more Stripe endpoint signing secrets whsec_…, comma-separated during a rotation"

// validSecrets returns a *config.RangeError when there is no secret or one
// is not of Stripe's endpoint signing secret shape (whsec_ followed by
// letters and digits); the value shown names the entry, never the secret.
func validSecrets(secrets []string) error {
	const name = config.Prefix + "STRIPE_WEBHOOK_SECRET"
	if len(secrets) == 0 {
		return &config.RangeError{Var: name, Value: "", Allowed: webhookSecretShape}
	}
	for i, s := range secrets {
		rest, ok := strings.CutPrefix(s, "whsec_")
		if !ok || rest == "" || strings.IndexFunc(rest, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_')
		}) >= 0 {
			what := "does not start with whsec_"
			if ok {
				what = "has nothing or other than letters, digits and _ after whsec_"
			}
			return &config.RangeError{Var: name, Value: fmt.Sprintf("(entry %d of %d, redacted: %s)", i+1, len(secrets), what),
				Allowed: webhookSecretShape}
		}
	}
	return nil
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
