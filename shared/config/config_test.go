package config

import (
	"errors"
	"strings"
	"testing"
)

type all struct {
	Database
	NATS
	Outbox
	Export
}

func (a *all) Validate() error {
	return errors.Join(a.Database.Validate(), a.NATS.Validate(), a.Outbox.Validate(), a.Export.Validate())
}

func TestDefaultsAreSeed000s(t *testing.T) {
	t.Parallel()
	var c all
	if err := LoadFrom(&c, map[string]string{}); err != nil {
		t.Fatal(err)
	}
	want := Outbox{LeaseSeconds: 120, MaxAttempts: 20, BatchSize: 100, BackoffBaseSeconds: 5, BackoffCapSeconds: 900, UncertaintyHorizonSeconds: 82800}
	if c.Outbox != want {
		t.Fatalf("defaults %+v, want %+v", c.Outbox, want)
	}
}

func TestOutOfRangeNamesVariableAndRange(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, value, wantVar, wantRange string
	}{
		{"AURORA_UNCERTAINTY_HORIZON_SECONDS", "86400", "AURORA_UNCERTAINTY_HORIZON_SECONDS", "60..86399"},
		{"AURORA_OUTBOX_LEASE_SECONDS", "0", "AURORA_OUTBOX_LEASE_SECONDS", "5..3600"},
		{"AURORA_OUTBOX_MAX_ATTEMPTS", "0", "AURORA_OUTBOX_MAX_ATTEMPTS", "1..1000"},
		{"AURORA_OUTBOX_BATCH_SIZE", "5000", "AURORA_OUTBOX_BATCH_SIZE", "1..1000"},
		{"AURORA_OUTBOX_BACKOFF_CAP_SECONDS", "1", "AURORA_OUTBOX_BACKOFF_CAP_SECONDS", "at least AURORA_OUTBOX_BACKOFF_BASE_SECONDS (5)"},
		{"AURORA_OUTBOX_BACKOFF_CAP_SECONDS", "0", "AURORA_OUTBOX_BACKOFF_CAP_SECONDS", "1..86400"},
		{"AURORA_STRIPE_MODE", "prod", "AURORA_STRIPE_MODE", "test|live"},
		{"AURORA_DATABASE_URL", "not a url", "AURORA_DATABASE_URL", "postgres"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var c all
			err := LoadFrom(&c, map[string]string{tt.name: tt.value})
			var re *RangeError
			if !errors.As(err, &re) {
				t.Fatalf("got %v, want *RangeError", err)
			}
			if re.Var != tt.wantVar || !strings.Contains(re.Allowed, tt.wantRange) {
				t.Fatalf("got %+v, want var %s range %s", re, tt.wantVar, tt.wantRange)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Fatal("does not wrap ErrInvalid")
			}
		})
	}
}

func TestMalformedNumberIsInvalid(t *testing.T) {
	t.Parallel()
	var c all
	err := LoadFrom(&c, map[string]string{"AURORA_OUTBOX_LEASE_SECONDS": "two minutes"})
	if !errors.Is(err, ErrInvalid) || err.Error() != "config: AURORA_OUTBOX_LEASE_SECONDS=two minutes is not an integer; allowed 5..3600 (seconds)" {
		t.Fatalf("got %v", err)
	}
}

func TestRedactURL(t *testing.T) {
	t.Parallel()
	tests := map[string]string{
		"postgres://u:s3cret@h:5432/db":                   "postgres://u:xxxxx@h:5432/db",
		"postgres://h/db?password=s3cret&sslmode=disable": "postgres://h/db?password=xxxxx&sslmode=disable",
		"postgres://h/db?sslpassword=s3cret":              "postgres://h/db?sslpassword=xxxxx",
		"nats://127.0.0.1:4222":                           "nats://127.0.0.1:4222",
		"https://api.stripe.com?api_key=sk_live_1&x=1":    "https://api.stripe.com?api_key=xxxxx&x=1",
		"%%%": "(unparseable URL, redacted)",
	}
	for in, want := range tests {
		if got := RedactURL(in); got != want || strings.Contains(got, "s3cret") {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestListenAddr: host:port or :port with a port in 0..65535; empty only
// when the listener is optional; the error names the variable.
func TestListenAddr(t *testing.T) {
	t.Parallel()
	tests := []struct {
		v        string
		optional bool
		ok       bool
	}{
		{"127.0.0.1:9101", false, true},
		{":8090", false, true},
		{"[::1]:0", false, true},
		{"localhost:65535", false, true},
		{"", true, true},
		{"", false, false},
		{"bad", false, false},
		{":99999", false, false},
		{":-1", true, false},
		{"127.0.0.1:http", false, false},
		{"127.0.0.1:", false, false},
	}
	for _, tt := range tests {
		err := ListenAddr("RELAY_HTTP_ADDR", tt.v, tt.optional)
		if (err == nil) != tt.ok {
			t.Errorf("ListenAddr(%q, optional=%v) = %v, want ok=%v", tt.v, tt.optional, err, tt.ok)
		}
		var re *RangeError
		if err != nil && (!errors.As(err, &re) || re.Var != "AURORA_RELAY_HTTP_ADDR" || !errors.Is(err, ErrInvalid)) {
			t.Errorf("ListenAddr(%q): %v is not a *RangeError naming AURORA_RELAY_HTTP_ADDR", tt.v, err)
		}
	}
}

// An empty (unset) value is reported as required, not as out of range.
func TestEmptyValueIsRequired(t *testing.T) {
	t.Parallel()
	err := error(&RangeError{Var: "AURORA_STRIPE_API_KEY", Value: "", Allowed: "a Stripe secret key sk_…"})
	if got := err.Error(); got != "config: AURORA_STRIPE_API_KEY is required; allowed a Stripe secret key sk_…" {
		t.Fatalf("got %q", got)
	}
	if err := ListenAddr("INBOX_ADDR", "", false); err == nil || !strings.Contains(err.Error(), "AURORA_INBOX_ADDR is required") {
		t.Fatalf("empty listen address: %v", err)
	}
}

// The messages a person reads name the variable they set, its range and
// the relation it breaks, and only the mistake made.
func TestMessagesNameWhatWasSet(t *testing.T) {
	t.Parallel()
	tests := []struct {
		env  map[string]string
		want string // the whole message
	}{
		{map[string]string{"AURORA_OUTBOX_LEASE_SECONDS": "99999999999999999999"},
			"config: AURORA_OUTBOX_LEASE_SECONDS=99999999999999999999 is out of range; allowed 5..3600 (seconds)"},
		{map[string]string{"AURORA_OUTBOX_LEASE_SECONDS": "-99999999999999999999"},
			"config: AURORA_OUTBOX_LEASE_SECONDS=-99999999999999999999 is out of range; allowed 5..3600 (seconds)"},
		{map[string]string{"AURORA_DATABASE_STATEMENT_TIMEOUT_MS": "-5"},
			"config: AURORA_DATABASE_STATEMENT_TIMEOUT_MS=-5 is out of range; allowed 0 (off) or 100..3600000 (milliseconds)"},
		{map[string]string{"AURORA_DATABASE_STATEMENT_TIMEOUT_MS": "5000"},
			"config: AURORA_DATABASE_STATEMENT_TIMEOUT_MS=5000 (set) must be at least AURORA_DATABASE_LOCK_TIMEOUT_MS=10000 (its default): a statement cannot wait for a lock longer than it may run; change AURORA_DATABASE_STATEMENT_TIMEOUT_MS or set AURORA_DATABASE_LOCK_TIMEOUT_MS"},
		{map[string]string{"AURORA_DATABASE_LOCK_TIMEOUT_MS": "40000"},
			"config: AURORA_DATABASE_LOCK_TIMEOUT_MS=40000 (set) must be at most AURORA_DATABASE_STATEMENT_TIMEOUT_MS=30000 (its default): a statement cannot wait for a lock longer than it may run; change AURORA_DATABASE_LOCK_TIMEOUT_MS or set AURORA_DATABASE_STATEMENT_TIMEOUT_MS"},
		{map[string]string{"AURORA_OUTBOX_BACKOFF_BASE_SECONDS": "1000"},
			"config: AURORA_OUTBOX_BACKOFF_BASE_SECONDS=1000 (set) must be at most AURORA_OUTBOX_BACKOFF_CAP_SECONDS=900 (its default): the largest retry delay cannot be below the first; change AURORA_OUTBOX_BACKOFF_BASE_SECONDS or set AURORA_OUTBOX_BACKOFF_CAP_SECONDS"},
	}
	for _, tc := range tests {
		var c all
		err := LoadFrom(&c, tc.env)
		if err == nil || err.Error() != tc.want || !errors.Is(err, ErrInvalid) {
			t.Errorf("%v:\n got %v\nwant %s", tc.env, err, tc.want)
		}
	}
}
