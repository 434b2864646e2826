// Package field holds the rules every text and quantity from outside obeys
// before it reaches Postgres or Stripe: the feeds, usage.Event,
// outbox.Item, auroractl's flags, provisioning and the webhook envelope
// check their fields with these functions, once, where the value enters,
// and wrap the answer in their own *FieldError naming the field.
//
// Each check returns "" when the value is acceptable and otherwise the
// reason, phrased to follow the field's name ("tenant: must not contain
// NUL"). A reason never quotes the value: values can be customer data.
package field

import (
	"fmt"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Length bounds, in bytes of UTF-8 (a byte bound is never looser than the
// same bound in characters).
const (
	// MaxTenantBytes bounds a tenant. A tenant is a Stripe customer
	// metadata value (Stripe: at most 500 characters) and a column of the
	// primary keys of usage_events and tenant_billing, whose btree entries
	// Postgres caps at about 2,700 bytes; 255 keeps a wide margin under both.
	MaxTenantBytes = 255
	// MaxEventIDBytes bounds a usage event id (part of usage_events'
	// primary key and of the item's subject_ref "event:<id>").
	MaxEventIDBytes = 255
	// MaxFeatureBytes bounds a feature name; see Feature.
	MaxFeatureBytes = 100
	// MaxStripeIDBytes bounds a Stripe object id aurora stores (account,
	// customer, meter, event). Stripe's own ids are under 100 characters;
	// 255 is a margin, and the Postgres index limit is far above it.
	MaxStripeIDBytes = 255
	// MaxMetadataKeyChars and MaxMetadataValueChars are Stripe's metadata
	// limits: keys at most 40 characters, values at most 500.
	MaxMetadataKeyChars   = 40
	MaxMetadataValueChars = 500
)

// MaxQuantity is the largest magnitude of a quantity: 15 significant
// digits, the most Stripe accepts in a meter event value (larger values are
// refused asynchronously, meter_event_value_too_many_digits). It is also
// exact in a float64 (below 2^53).
const MaxQuantity int64 = 999_999_999_999_999

// Text checks an identifier-like text: not blank, valid UTF-8 (invalid
// bytes are refused, never replaced), without U+FFFD (what a decoder leaves
// of invalid bytes or lone surrogate escapes, so two different inputs could
// not be told apart), without NUL (Postgres text cannot hold it) or other
// control characters, and at most maxBytes bytes long.
func Text(v string, maxBytes int) string {
	switch {
	case strings.TrimSpace(v) == "":
		return "must not be empty"
	case !utf8.ValidString(v):
		return "must be valid UTF-8"
	case len(v) > maxBytes:
		return fmt.Sprintf("is %d bytes, longer than %d", len(v), maxBytes)
	}
	for _, r := range v {
		switch {
		case r == 0:
			return "must not contain NUL"
		case r == utf8.RuneError:
			return "must not contain U+FFFD (replaced invalid text)"
		case unicode.IsControl(r):
			return "must not contain control characters"
		}
	}
	return ""
}

// OptionalText is Text for a value that may be absent: "" passes.
func OptionalText(v string, maxBytes int) string {
	if v == "" {
		return ""
	}
	return Text(v, maxBytes)
}

var featureName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$`)

// Feature checks a feature name: [A-Za-z0-9][A-Za-z0-9_.-]{0,99}, the
// syntax of AURORA_FEATURE_SOURCES, so a feature can be named in
// configuration and in a meter's event name.
func Feature(v string) string {
	if v == "" {
		return "must not be empty"
	}
	if !featureName.MatchString(v) {
		return fmt.Sprintf("must match %s (letters, digits, _ . -; at most %d bytes)", featureName, MaxFeatureBytes)
	}
	return ""
}

// Quantity checks a quantity: |q| ≤ MaxQuantity, and q ≥ 0 unless
// negative is allowed (a correction).
func Quantity(q int64, negative bool) string {
	switch {
	case !negative && q < 0:
		return "must be >= 0"
	case q > MaxQuantity || q < -MaxQuantity:
		return fmt.Sprintf("has more than 15 significant digits (at most %d in magnitude; Stripe refuses more)", MaxQuantity)
	}
	return ""
}

// MetadataKey and MetadataValue check a Stripe metadata entry (Stripe: keys
// at most 40 characters, values at most 500; neither may hold NUL).
func MetadataKey(k string) string {
	if n := utf8.RuneCountInString(k); n > MaxMetadataKeyChars {
		return fmt.Sprintf("is %d characters, longer than Stripe's %d for a metadata key", n, MaxMetadataKeyChars)
	}
	return Text(k, 4*MaxMetadataKeyChars)
}

// MetadataValue: see MetadataKey.
func MetadataValue(v string) string {
	if n := utf8.RuneCountInString(v); n > MaxMetadataValueChars {
		return fmt.Sprintf("is %d characters, longer than Stripe's %d for a metadata value", n, MaxMetadataValueChars)
	}
	return Text(v, 4*MaxMetadataValueChars)
}

// Storable returns s as Postgres text can hold it, for texts aurora stores
// but does not judge (a provider's error message, a header): invalid UTF-8
// and NUL become U+FFFD (a replacement, not a deletion, so no new code or
// message can appear), then s is cut to at most maxBytes without splitting
// a character. One value Postgres refuses fails a whole batched statement,
// so every such text goes through here.
func Storable(s string, maxBytes int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if strings.IndexByte(s, 0) >= 0 {
		s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	}
	if len(s) <= maxBytes {
		return s
	}
	cut := maxBytes
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}
