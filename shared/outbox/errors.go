package outbox

import (
	"errors"
	"fmt"
)

var (
	// ErrStaleLease: a fenced transition updated zero rows because the item
	// was reclaimed (lease_token moved) or already left leased. A first-class
	// outcome: counted, logged, never retried (seed 000, "stale_lease").
	ErrStaleLease = errors.New("outbox: stale_lease")
	// ErrPayloadConflict: the identity already exists with a different
	// payload. Nothing was written.
	ErrPayloadConflict = errors.New("outbox: payload_conflict")
	// ErrInvalidItem: the item failed validation; see *FieldError.
	ErrInvalidItem = errors.New("outbox: invalid item")
	// ErrNotFound: no item with that id.
	ErrNotFound = errors.New("outbox: not_found")
)

// FieldError names the field of an Item that failed validation. It wraps
// ErrInvalidItem.
type FieldError struct {
	Field  string
	Reason string
}

func (e *FieldError) Error() string { return fmt.Sprintf("outbox: invalid %s: %s", e.Field, e.Reason) }

// Unwrap returns ErrInvalidItem.
func (e *FieldError) Unwrap() error { return ErrInvalidItem }

// PayloadConflictError carries the existing row's id when staging an
// existing identity with a different payload. It wraps ErrPayloadConflict.
type PayloadConflictError struct {
	ExistingID int64
}

func (e *PayloadConflictError) Error() string {
	return fmt.Sprintf("outbox: payload_conflict: item %d has the same identity and a different payload", e.ExistingID)
}

// Unwrap returns ErrPayloadConflict.
func (e *PayloadConflictError) Unwrap() error { return ErrPayloadConflict }
