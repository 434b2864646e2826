package recovery

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aurora-billing/aurora/shared/outbox"
)

var (
	// ErrNotFound: no outbox item with that id. Nothing is recorded (there
	// is no item to attach the action to).
	ErrNotFound = errors.New("recovery: not_found")
	// ErrExpectedStateMismatch: the row is not what the caller expected
	// (seed 000, {:error, {:expected_state_mismatch, current}}). The
	// concrete error is *ExpectedStateMismatchError carrying the row now.
	ErrExpectedStateMismatch = errors.New("recovery: expected_state_mismatch")
	// ErrInvalidReason: the reason is blank or whitespace.
	ErrInvalidReason = errors.New("recovery: invalid_reason")
	// ErrInvalidEvidence: the evidence is blank or whitespace.
	ErrInvalidEvidence = errors.New("recovery: invalid_evidence")
	// ErrInvalidActor: the actor is blank or whitespace.
	ErrInvalidActor = errors.New("recovery: invalid_actor")
	// ErrInvalidExpected: the expected-state map is incomplete, or names a
	// state the action does not start from (acknowledge and abandon start
	// from uncertain, requeue from quarantined). The concrete error is
	// *InvalidExpectedError.
	ErrInvalidExpected = errors.New("recovery: invalid_expected")
	// ErrMappingChanged: a requeue whose item was built for a mapping
	// version that is no longer current (seed 000, "Quarantine",
	// {:error, :mapping_changed}). The concrete error is
	// *MappingChangedError.
	ErrMappingChanged = errors.New("recovery: mapping_changed")
	// ErrStillBuffered: a requeue of an item quarantined period_buffered
	// whose period the buffered counters still bill: no cutover watermark
	// for its feature (tenant's or global), or its period starts before the
	// watermark. Sending it would bill the period twice (seed 000, "Cutting
	// a feature over": the split is exclusive). The concrete error is
	// *StillBufferedError.
	ErrStillBuffered = errors.New("recovery: still_buffered")
	// ErrInvalidQuery: a List call with an unsupported state, a negative
	// age or a limit outside 1..MaxLimit.
	ErrInvalidQuery = errors.New("recovery: invalid_query")
)

// Refusal is the atom stored in recovery_actions.refusal when a call is
// refused (NULL when it applied).
type Refusal string

const (
	RefusalExpectedStateMismatch Refusal = "expected_state_mismatch" // ErrExpectedStateMismatch
	RefusalInvalidReason         Refusal = "invalid_reason"          // ErrInvalidReason
	RefusalInvalidEvidence       Refusal = "invalid_evidence"        // ErrInvalidEvidence
	RefusalInvalidActor          Refusal = "invalid_actor"           // ErrInvalidActor
	RefusalInvalidExpected       Refusal = "invalid_expected"        // ErrInvalidExpected
	RefusalMappingChanged        Refusal = "mapping_changed"         // ErrMappingChanged
	RefusalStillBuffered         Refusal = "still_buffered"          // ErrStillBuffered
)

// RefusalOf returns the refusal atom of a refusal error, or "" for any
// other error (a failure, which records nothing).
func RefusalOf(err error) Refusal {
	switch {
	case errors.Is(err, ErrExpectedStateMismatch):
		return RefusalExpectedStateMismatch
	case errors.Is(err, ErrInvalidReason):
		return RefusalInvalidReason
	case errors.Is(err, ErrInvalidEvidence):
		return RefusalInvalidEvidence
	case errors.Is(err, ErrInvalidActor):
		return RefusalInvalidActor
	case errors.Is(err, ErrInvalidExpected):
		return RefusalInvalidExpected
	case errors.Is(err, ErrMappingChanged):
		return RefusalMappingChanged
	case errors.Is(err, ErrStillBuffered):
		return RefusalStillBuffered
	default:
		return restageRefusal(err)
	}
}

// ExpectedStateMismatchError is the refusal of a call whose expected state
// does not match the row. Current is the row as it is now; Fields names the
// expected fields that differ (state, lease_token, subject_ref,
// provider_ref). It wraps ErrExpectedStateMismatch.
type ExpectedStateMismatchError struct {
	ItemID   int64
	Expected Expected
	Current  outbox.Row
	Fields   []string
}

func (e *ExpectedStateMismatchError) Error() string {
	now := Observe(e.Current)
	return fmt.Sprintf("recovery: expected_state_mismatch: item %d differs in %s; now state=%s lease_token=%d",
		e.ItemID, strings.Join(e.Fields, ", "), now.State, now.LeaseToken)
}

// Unwrap returns ErrExpectedStateMismatch.
func (e *ExpectedStateMismatchError) Unwrap() error { return ErrExpectedStateMismatch }

// InvalidExpectedError names the expected field that is missing or not
// allowed for the action. It wraps ErrInvalidExpected.
type InvalidExpectedError struct {
	Field  string // "state", "subject_ref" or "provider_ref"
	Reason string
}

func (e *InvalidExpectedError) Error() string {
	return "recovery: invalid_expected: " + e.Field + ": " + e.Reason
}

// Unwrap returns ErrInvalidExpected.
func (e *InvalidExpectedError) Unwrap() error { return ErrInvalidExpected }

// MappingChangedError is the refusal of a requeue across a mapping version
// change: the item was built for ItemVersion, the feature's mapping on the
// item's destination account is now CurrentVersion (0 = not mapped). It
// wraps ErrMappingChanged.
type MappingChangedError struct {
	ItemID         int64
	ItemVersion    int32
	CurrentVersion int32
}

func (e *MappingChangedError) Error() string {
	return fmt.Sprintf("recovery: mapping_changed: item %d was built for mapping version %d, current is %d",
		e.ItemID, e.ItemVersion, e.CurrentVersion)
}

// Unwrap returns ErrMappingChanged.
func (e *MappingChangedError) Unwrap() error { return ErrMappingChanged }

// StillBufferedError is the refusal to requeue a period_buffered item whose
// period the counters still bill. Watermark is the feature's cutover
// watermark for the item's tenant (nil: none scheduled). It wraps
// ErrStillBuffered.
type StillBufferedError struct {
	ItemID      int64
	PeriodStart time.Time
	Watermark   *time.Time
}

func (e *StillBufferedError) Error() string {
	if e.Watermark == nil {
		return fmt.Sprintf("recovery: still_buffered: item %d's period %s is billed by the buffered counters (no cutover watermark for its feature)",
			e.ItemID, e.PeriodStart.UTC().Format(time.RFC3339))
	}
	return fmt.Sprintf("recovery: still_buffered: item %d's period %s starts before the cutover watermark %s",
		e.ItemID, e.PeriodStart.UTC().Format(time.RFC3339), e.Watermark.UTC().Format(time.RFC3339))
}

// Unwrap returns ErrStillBuffered.
func (e *StillBufferedError) Unwrap() error { return ErrStillBuffered }
