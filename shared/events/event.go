package events

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"time"

	"github.com/aurora-billing/aurora/shared/field"
)

// StreamName is the JetStream stream that carries domain events.
const StreamName = "AURORA_EVENTS"

// SubjectPrefix starts every event subject: aurora.events.<Name>.<vN>, so
// "InvoicePaid.v1" is published on aurora.events.InvoicePaid.v1 and a
// consumer filters on exactly its types.
const SubjectPrefix = "aurora.events"

// MaxPayloadBytes bounds an event's JSON payload (64 KiB): events announce
// facts, they do not carry documents.
const MaxPayloadBytes = 64 << 10

// MaxAggregateIDBytes bounds AggregateID (a CHECK on event_outbox too).
const MaxAggregateIDBytes = 200

var (
	typePattern     = regexp.MustCompile(`^[A-Z][A-Za-z0-9]{0,99}\.v[1-9][0-9]{0,3}$`)
	idPattern       = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	consumerPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)
)

// Event is one domain event as a producer writes it.
type Event struct {
	// ID is the event's identity, a lowercase UUID; empty: Publish makes a
	// random (version 4) one. A producer that may announce the same fact
	// twice derives the ID from the fact: the second Publish of an ID
	// returns ErrDuplicateEvent and writes nothing.
	ID string
	// Type is "Name.vN": an upper-case initial, letters and digits, a dot,
	// v and a version 1..9999, e.g. "InvoicePaid.v1".
	Type string
	// AggregateID names the entity the event is about (an invoice id, a
	// tenant), 1..200 bytes of printable UTF-8.
	AggregateID string
	// Payload is a JSON object of at most MaxPayloadBytes.
	Payload json.RawMessage
}

// Validate returns a *FieldError (ErrInvalidEvent) naming the first bad
// field.
func (e Event) Validate() error {
	if e.ID != "" && !idPattern.MatchString(e.ID) {
		return &FieldError{Field: "id", Reason: "must be a lowercase UUID"}
	}
	if !typePattern.MatchString(e.Type) {
		return &FieldError{Field: "type", Reason: `must look like "Name.v1" (upper-case initial, letters and digits, .v and a version)`}
	}
	if r := field.Text(e.AggregateID, MaxAggregateIDBytes); r != "" {
		return &FieldError{Field: "aggregate_id", Reason: r}
	}
	if len(e.Payload) > MaxPayloadBytes {
		return &FieldError{Field: "payload", Reason: fmt.Sprintf("is %d bytes, more than %d", len(e.Payload), MaxPayloadBytes)}
	}
	trimmed := bytes.TrimSpace(e.Payload)
	if len(trimmed) == 0 || trimmed[0] != '{' || !json.Valid(trimmed) {
		return &FieldError{Field: "payload", Reason: "must be a JSON object"}
	}
	return nil
}

// ValidType reports whether t is a well-formed event type ("Name.vN").
func ValidType(t string) bool { return typePattern.MatchString(t) }

// ValidID reports whether id is a lowercase UUID.
func ValidID(id string) bool { return idPattern.MatchString(id) }

// Subject returns the subject an event of type t is published on.
func Subject(t string) string { return SubjectPrefix + "." + t }

// Delivery is an event as a handler receives it.
type Delivery struct {
	Event
	// CreatedAt is when the producer's transaction wrote the row (database
	// clock).
	CreatedAt time.Time
	// Attempt is 1 on the first try of this consumer, 2 after one recorded
	// failure, and so on.
	Attempt int
	// Source says which path delivered it: SourceRealtime or SourceCatchUp.
	Source Source
}

// Source is the path that delivered an event to a handler.
type Source string

const (
	// SourceRealtime: a JetStream message.
	SourceRealtime Source = "realtime"
	// SourceCatchUp: the catch-up loop's list of dispatched events.
	SourceCatchUp Source = "catch_up"
)

// NewID returns a random version 4 UUID in lowercase.
func NewID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// envelope is the JSON body of a stream message. Consumers read the event
// from event_outbox (Postgres is the truth); the body serves observers such
// as `nats stream view AURORA_EVENTS`.
type envelope struct {
	ID          string          `json:"id"`
	Type        string          `json:"type"`
	AggregateID string          `json:"aggregate_id"`
	CreatedAt   time.Time       `json:"created_at"`
	Payload     json.RawMessage `json:"payload"`
}
