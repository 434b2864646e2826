package events

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/shared/config"
)

func TestEventValidate(t *testing.T) {
	t.Parallel()
	ok := Event{Type: "InvoicePaid.v1", AggregateID: "in_1", Payload: json.RawMessage(`{"a":1}`)}
	tests := []struct {
		name  string
		edit  func(*Event)
		field string // "" = valid
	}{
		{"valid", func(*Event) {}, ""},
		{"valid with id", func(e *Event) { e.ID = NewID() }, ""},
		{"upper-case id", func(e *Event) { e.ID = strings.ToUpper(NewID()) }, "id"},
		{"id not a uuid", func(e *Event) { e.ID = "evt_1" }, "id"},
		{"type without version", func(e *Event) { e.Type = "InvoicePaid" }, "type"},
		{"type lower-case", func(e *Event) { e.Type = "invoicePaid.v1" }, "type"},
		{"type v0", func(e *Event) { e.Type = "InvoicePaid.v0" }, "type"},
		{"type with subject wildcard", func(e *Event) { e.Type = "Invoice*.v1" }, "type"},
		{"type with extra token", func(e *Event) { e.Type = "Invoice.Paid.v1" }, "type"},
		{"empty aggregate", func(e *Event) { e.AggregateID = "" }, "aggregate_id"},
		{"aggregate too long", func(e *Event) { e.AggregateID = strings.Repeat("a", 201) }, "aggregate_id"},
		{"aggregate with NUL", func(e *Event) { e.AggregateID = "a\x00b" }, "aggregate_id"},
		{"payload empty", func(e *Event) { e.Payload = nil }, "payload"},
		{"payload array", func(e *Event) { e.Payload = json.RawMessage(`[1]`) }, "payload"},
		{"payload not json", func(e *Event) { e.Payload = json.RawMessage(`{nope`) }, "payload"},
		{"payload too big", func(e *Event) {
			e.Payload = json.RawMessage(`{"a":"` + strings.Repeat("x", MaxPayloadBytes) + `"}`)
		}, "payload"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev := ok
			tt.edit(&ev)
			err := ev.Validate()
			if tt.field == "" {
				if err != nil {
					t.Fatalf("Validate = %v, want nil", err)
				}
				return
			}
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != tt.field || !errors.Is(err, ErrInvalidEvent) {
				t.Fatalf("Validate = %v, want *FieldError on %s wrapping ErrInvalidEvent", err, tt.field)
			}
			if wrapped := fmt.Errorf("outer: %w", err); !errors.Is(wrapped, ErrInvalidEvent) {
				t.Fatal("wrapped FieldError lost ErrInvalidEvent")
			}
		})
	}
}

func TestIDs(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 1000 {
		id := NewID()
		if !ValidID(id) || seen[id] || id[14] != '4' {
			t.Fatalf("NewID %q: not a fresh v4 UUID", id)
		}
		seen[id] = true
	}
	a, b := IDFor("stripe", "evt_1", "InvoicePaid.v1"), IDFor("stripe", "evt_1", "InvoicePaid.v1")
	if a != b || !ValidID(a) || a[14] != '8' {
		t.Fatalf("IDFor not stable or not a v8 UUID: %q %q", a, b)
	}
	// length prefixes: ("ab","c") and ("a","bc") differ
	if IDFor("ab", "c") == IDFor("a", "bc") {
		t.Fatal("IDFor: two tuples encode alike")
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	var loaded Config
	if err := config.LoadFrom(&loaded, map[string]string{}); err != nil {
		t.Fatalf("load with no variables: %v", err)
	}
	if loaded != DefaultConfig() {
		t.Fatalf("env defaults %+v differ from DefaultConfig %+v", loaded, DefaultConfig())
	}
	if DefaultConfig().consumerInterval() != 5*time.Second || DefaultConfig().CatchUpLimit != 200 {
		t.Fatal("seed 004's interval (5,000 ms) and catch-up limit (200) are the defaults")
	}
	tests := []struct {
		name string
		edit func(*Config)
		v    string
	}{
		{"interval too short", func(c *Config) { c.ConsumerIntervalMS = 50 }, "AURORA_EVENTS_CONSUMER_INTERVAL_MS"},
		{"catch-up limit 0", func(c *Config) { c.CatchUpLimit = 0 }, "AURORA_EVENTS_CATCH_UP_LIMIT"},
		{"max deliver not above attempts", func(c *Config) { c.ConsumerMaxDeliver = c.ConsumerMaxAttempts }, "AURORA_EVENTS_CONSUMER_MAX_DELIVER"},
		{"retention within stream age", func(c *Config) { c.RetentionHours = c.StreamMaxAgeHours }, "AURORA_EVENTS_RETENTION_HOURS"},
		{"backoff cap below base", func(c *Config) { c.ConsumerBackoffCapMS = c.ConsumerBackoffBaseMS - 1 }, "AURORA_EVENTS_CONSUMER_BACKOFF_CAP_MS"},
		{"lease not above publish timeout", func(c *Config) { c.DispatchLeaseSeconds = 5 }, "AURORA_EVENTS_DISPATCH_LEASE_SECONDS"},
		{"dedupe window past max age", func(c *Config) { c.StreamMaxAgeHours = 1; c.RetentionHours = 2; c.DuplicateWindowSeconds = 7200 }, "AURORA_EVENTS_DUPLICATE_WINDOW_SECONDS"},
	}
	for _, tt := range tests {
		c := DefaultConfig()
		tt.edit(&c)
		err := c.Validate()
		var re *config.RangeError
		if !errors.As(err, &re) || re.Var != tt.v || !errors.Is(err, config.ErrInvalid) {
			t.Errorf("%s: %v, want a RangeError naming %s", tt.name, err, tt.v)
		}
	}
	if got := backoff(1000, 300000, 1); got != time.Second {
		t.Errorf("backoff(1) = %s", got)
	}
	if got := backoff(1000, 300000, 4); got != 8*time.Second {
		t.Errorf("backoff(4) = %s", got)
	}
	if got := backoff(1000, 300000, 40); got != 300*time.Second {
		t.Errorf("backoff(40) = %s, want the cap", got)
	}
}

// A relation between two knobs names the one that was set: raising the
// publish timeout past the default lease blames the timeout, not the
// lease nobody touched.
func TestConfigRelationNamesWhatWasSet(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"AURORA_EVENTS_PUBLISH_TIMEOUT_MS": "40000"},
			"config: AURORA_EVENTS_PUBLISH_TIMEOUT_MS=40000 (set) leaves AURORA_EVENTS_DISPATCH_LEASE_SECONDS=30 (its default) out of range: it must be at least AURORA_EVENTS_PUBLISH_TIMEOUT_MS / 1000 + 1 = 41"},
		{map[string]string{"AURORA_EVENTS_STREAM_MAX_AGE_HOURS": "200"},
			"config: AURORA_EVENTS_STREAM_MAX_AGE_HOURS=200 (set) must be less than AURORA_EVENTS_RETENTION_HOURS=168 (its default)"},
		{map[string]string{"AURORA_EVENTS_CONSUMER_MAX_ATTEMPTS": "50"},
			"config: AURORA_EVENTS_CONSUMER_MAX_ATTEMPTS=50 (set) must be less than AURORA_EVENTS_CONSUMER_MAX_DELIVER="},
	} {
		var c Config
		err := config.LoadFrom(&c, tc.env)
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%v:\n got %v\nwant %s…", tc.env, err, tc.want)
		}
	}
}
