package recovery_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/aurora-billing/aurora/recovery"
	"github.com/aurora-billing/aurora/shared/outbox"
)

// Every typed error is its sentinel under ==-free errors.Is, wrapped or not,
// and reachable with errors.As.
func TestTypedErrors(t *testing.T) {
	t.Parallel()
	mm := &recovery.ExpectedStateMismatchError{ItemID: 1, Current: outbox.Row{State: outbox.StateAccepted, LeaseToken: 3}, Fields: []string{"state"}}
	mc := &recovery.MappingChangedError{ItemID: 1, ItemVersion: 0, CurrentVersion: 1}
	ie := &recovery.InvalidExpectedError{Field: "state", Reason: "is required"}
	tests := []struct {
		err      error
		sentinel error
		text     string
	}{
		{mm, recovery.ErrExpectedStateMismatch, "recovery: expected_state_mismatch: item 1 differs in state; now state=accepted lease_token=3"},
		{mc, recovery.ErrMappingChanged, "recovery: mapping_changed: item 1 was built for mapping version 0, current is 1"},
		{ie, recovery.ErrInvalidExpected, "recovery: invalid_expected: state: is required"},
	}
	for _, tt := range tests {
		if !errors.Is(tt.err, tt.sentinel) || !errors.Is(fmt.Errorf("wrapped: %w", tt.err), tt.sentinel) {
			t.Errorf("%T is not %v", tt.err, tt.sentinel)
		}
		if tt.err.Error() != tt.text {
			t.Errorf("%q", tt.err.Error())
		}
	}
	var gotMM *recovery.ExpectedStateMismatchError
	if !errors.As(fmt.Errorf("x: %w", mm), &gotMM) || gotMM.Current.State != outbox.StateAccepted {
		t.Error("errors.As mismatch")
	}
	var gotMC *recovery.MappingChangedError
	if !errors.As(fmt.Errorf("x: %w", mc), &gotMC) || gotMC.CurrentVersion != 1 {
		t.Error("errors.As mapping")
	}
	for _, s := range []error{recovery.ErrNotFound, recovery.ErrInvalidReason, recovery.ErrInvalidEvidence, recovery.ErrInvalidActor, recovery.ErrInvalidQuery} {
		if !errors.Is(fmt.Errorf("x: %w", s), s) || s.Error()[:10] != "recovery: " {
			t.Errorf("%v", s)
		}
	}
}
