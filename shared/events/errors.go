package events

import (
	"errors"
	"fmt"
)

var (
	// ErrInvalidEvent is wrapped by every *FieldError: Publish refused the
	// event and wrote nothing.
	ErrInvalidEvent = errors.New("events: invalid event")
	// ErrInvalidOption is wrapped by an option that refuses its argument.
	ErrInvalidOption = errors.New("events: invalid option")
	// ErrNilDependency: a constructor was given a nil pool or JetStream
	// context.
	ErrNilDependency = errors.New("events: nil dependency")
	// ErrStreamConfig: JetStream refused the AURORA_EVENTS stream or a
	// consumer's configuration; not retried.
	ErrStreamConfig = errors.New("events: stream configuration refused")
	// ErrNotFound: no event (or no inbox row of that consumer) with that id.
	ErrNotFound = errors.New("events: not found")
	// ErrNotDeadLettered (atom not_dead_lettered): a requeue named an event
	// or inbox row that is not dead-lettered; nothing changed.
	ErrNotDeadLettered = errors.New("events: not_dead_lettered")
	// ErrInvalidRequest: an operator call lacks its operator or reason.
	ErrInvalidRequest = errors.New("events: invalid request")
	// ErrAlreadyRunning: Consume was called twice for one consumer name on
	// one Client, or Run twice on one Dispatcher.
	ErrAlreadyRunning = errors.New("events: already running")
	// ErrDispatcherNotRunning: Dispatcher.Ready was asked while Run is not
	// dispatching (not started, still ensuring the stream, or returned).
	ErrDispatcherNotRunning = errors.New("events: dispatcher not running")
)

// FieldError names the field of an Event (or a Consume argument) that is
// invalid and why. It wraps ErrInvalidEvent. Reason never quotes the value.
type FieldError struct {
	Field  string
	Reason string
}

func (e *FieldError) Error() string { return fmt.Sprintf("events: %s: %s", e.Field, e.Reason) }

// Unwrap returns ErrInvalidEvent.
func (e *FieldError) Unwrap() error { return ErrInvalidEvent }

// ErrDuplicateEvent: Publish was given an ID that event_outbox already
// holds. The producer's transaction stays usable (the insert is ON CONFLICT
// DO NOTHING); the existing event is unchanged.
var ErrDuplicateEvent = errors.New("events: duplicate event id")
