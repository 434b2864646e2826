package reconciler

import (
	"errors"
	"fmt"
)

var (
	// ErrInvalidResolution: a blank or whitespace resolution (seed 000: an
	// empty explanation is worse than an open item). Atom invalid_resolution.
	ErrInvalidResolution = errors.New("reconciler: invalid_resolution")
	// ErrInvalidActor: no actor named. Atom invalid_actor.
	ErrInvalidActor = errors.New("reconciler: invalid_actor")
	// ErrNotFound: no reconciliation item with that id.
	ErrNotFound = errors.New("reconciler: item not found")
	// ErrAlreadyResolved: the item was resolved before; see
	// *AlreadyResolvedError. Atom already_resolved.
	ErrAlreadyResolved = errors.New("reconciler: already_resolved")
	// ErrInvalidQuery: a list call with an unknown state or a limit outside
	// 1..MaxLimit.
	ErrInvalidQuery = errors.New("reconciler: invalid query")
	// ErrProvider wraps every failed provider call; the run records it and
	// ends without recording findings or confirmations.
	ErrProvider = errors.New("reconciler: provider call failed")
	// ErrUnknownCustomer: Stripe does not know the customer a summary was
	// asked for (resource_missing on customer). The run counts the
	// customer's windows as holding nothing at Stripe, which is what
	// Stripe bills.
	ErrUnknownCustomer = errors.New("reconciler: customer unknown at Stripe")
)

// AlreadyResolvedError names who resolved the item and how.
type AlreadyResolvedError struct {
	ID         int64
	ResolvedBy string
	Resolution string
}

func (e *AlreadyResolvedError) Error() string {
	return fmt.Sprintf("reconciler: already_resolved: item %d was resolved by %s (%q)", e.ID, e.ResolvedBy, e.Resolution)
}

// Unwrap returns ErrAlreadyResolved.
func (e *AlreadyResolvedError) Unwrap() error { return ErrAlreadyResolved }

// Refusal is the atom recorded for a refused resolve.
type Refusal string

// Refusal atoms.
const (
	RefusalInvalidResolution Refusal = "invalid_resolution"
	RefusalInvalidActor      Refusal = "invalid_actor"
	RefusalAlreadyResolved   Refusal = "already_resolved"
)

// RefusalOf returns err's refusal atom, or "" when err is not a refusal.
func RefusalOf(err error) Refusal {
	switch {
	case errors.Is(err, ErrInvalidResolution):
		return RefusalInvalidResolution
	case errors.Is(err, ErrInvalidActor):
		return RefusalInvalidActor
	case errors.Is(err, ErrAlreadyResolved):
		return RefusalAlreadyResolved
	}
	return ""
}
