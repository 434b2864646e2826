// Package identity holds the seven-part identity of an export item and the
// idempotency key derived from it (seed 000, "Identity, and the key that makes
// retries safe").
//
// The key is a pure function of four of the seven parts. It carries no nonce,
// no time and no attempt number, so every attempt of the same work sends the
// same value as Stripe's Idempotency-Key header and as the meter event's
// identifier.
package identity

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/aurora-billing/aurora/shared/field"
)

// SubjectKind is what an item exports. The same list is a CHECK constraint on
// outbox_items.subject_kind.
type SubjectKind string

const (
	// SubjectUsageWindow is a buffered counter window, subject_ref
	// usage:<feature>:<period start RFC 3339 UTC>:<from>:<to>.
	SubjectUsageWindow SubjectKind = "usage_window"
	// SubjectEvent is one durable usage event of the recording era.
	SubjectEvent SubjectKind = "event"
	// SubjectCorrection corrects one earlier durable event.
	SubjectCorrection SubjectKind = "correction"
)

// Valid reports whether k is one of the three subject kinds.
func (k SubjectKind) Valid() bool {
	switch k {
	case SubjectUsageWindow, SubjectEvent, SubjectCorrection:
		return true
	default:
		return false
	}
}

// Mode is the Stripe mode an item is destined for.
type Mode string

const (
	// ModeTest is Stripe test mode (sk_test_ keys).
	ModeTest Mode = "test"
	// ModeLive is Stripe live mode (sk_live_ keys).
	ModeLive Mode = "live"
)

// Valid reports whether m is test or live.
func (m Mode) Valid() bool { return m == ModeTest || m == ModeLive }

// MaxKeyPartBytes bounds each string part so that a part's length always fits
// the key's 4-byte length prefix with a wide margin and rows stay indexable.
const MaxKeyPartBytes = 1024

// ErrInvalid is the sentinel every validation error wraps.
var ErrInvalid = errors.New("identity: invalid")

// FieldError names the identity field that failed validation. It wraps
// ErrInvalid.
type FieldError struct {
	Field  string // column name, e.g. "subject_kind"
	Reason string // what is wrong, e.g. "must be one of usage_window|event|correction"
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("identity: invalid %s: %s", e.Field, e.Reason)
}

// Unwrap returns ErrInvalid.
func (e *FieldError) Unwrap() error { return ErrInvalid }

// Identity is the seven-part identity of an outbox item. The tuple is unique
// in outbox_items and immutable once written (a database trigger enforces
// it). Its JSON names are the columns' (snake_case), as everywhere else in
// aurora's JSON output (an outbox.Row embeds it).
type Identity struct {
	Tenant             string      `json:"tenant"`              // the application's tenant, e.g. "org_123"
	SubjectKind        SubjectKind `json:"subject_kind"`        // usage_window | event | correction
	SubjectRef         string      `json:"subject_ref"`         // e.g. "usage:api_calls:2026-09-01T00:00:00Z:0:5"
	Exporter           string      `json:"exporter"`            // e.g. "stripe_meter_events"
	DestinationAccount string      `json:"destination_account"` // Stripe account, e.g. "acct_1Test"
	Mode               Mode        `json:"mode"`                // test | live
	MappingVersion     int32       `json:"mapping_version"`     // feature→meter mapping version the item was built for (0 = no mapping yet)
}

// Validate returns a *FieldError (wrapping ErrInvalid) naming the first bad
// field, or nil. String parts follow field.Text (not blank, valid UTF-8, no
// NUL, U+FFFD or control characters): tenant at most field.MaxTenantBytes,
// destination_account at most field.MaxStripeIDBytes, subject_ref and
// exporter at most MaxKeyPartBytes.
func (id Identity) Validate() error {
	for _, p := range []struct {
		name, v string
		max     int
	}{
		{"tenant", id.Tenant, field.MaxTenantBytes},
		{"subject_ref", id.SubjectRef, MaxKeyPartBytes},
		{"exporter", id.Exporter, MaxKeyPartBytes},
		{"destination_account", id.DestinationAccount, field.MaxStripeIDBytes},
	} {
		if r := field.Text(p.v, p.max); r != "" {
			return &FieldError{Field: p.name, Reason: r}
		}
	}
	if !id.SubjectKind.Valid() {
		return &FieldError{Field: "subject_kind", Reason: fmt.Sprintf("%q is not one of usage_window|event|correction", string(id.SubjectKind))}
	}
	if !id.Mode.Valid() {
		return &FieldError{Field: "mode", Reason: fmt.Sprintf("%q is not one of test|live", string(id.Mode))}
	}
	if id.MappingVersion < 0 {
		return &FieldError{Field: "mapping_version", Reason: "must be >= 0"}
	}
	return nil
}

// Key returns the idempotency key of id: lowercase hex SHA-256 over tenant,
// subject_kind, subject_ref and destination_account, each encoded as a 4-byte
// big-endian byte length followed by its UTF-8 bytes. The length prefix makes
// the encoding injective: no two tuples encode alike.
//
// Exporter, mode and mapping version are deliberately left out: the same work
// rebuilt for a new mapping version is still the same work at Stripe, and
// must collapse onto Stripe's record of it. Test vector (README):
//
//	Key("org_123", "usage_window", "usage:api_calls:2026-09-01T00:00:00Z:0:5", "acct_1Test")
//	= 77ccacd8c75a588c78de426666baa67e43c34992cb5ab11df4a94afe3e8601fc
//
// The result is 64 characters, inside Stripe's 100-character identifier and
// 255-character Idempotency-Key limits.
func (id Identity) Key() string {
	return Key(id.Tenant, id.SubjectKind, id.SubjectRef, id.DestinationAccount)
}

// Key computes the idempotency key from its four parts; see Identity.Key.
func Key(tenant string, kind SubjectKind, subjectRef, destinationAccount string) string {
	h := sha256.New()
	var n [4]byte
	for _, part := range []string{tenant, string(kind), subjectRef, destinationAccount} {
		binary.BigEndian.PutUint32(n[:], uint32(len(part)))
		h.Write(n[:])
		h.Write([]byte(part))
	}
	return hex.EncodeToString(h.Sum(nil))
}
