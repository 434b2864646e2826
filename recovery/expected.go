package recovery

import (
	"strings"
	"time"

	"github.com/aurora-billing/aurora/shared/outbox"
)

// Expected is what the caller believes the row is (seed 000: "each of which
// requires you to state what you expect to be true, so a stale screen cannot
// act on a row that has since moved"). State and SubjectRef are required;
// LeaseToken is always compared (0 is a valid token: never claimed);
// ProviderRef is compared only when non-nil.
type Expected struct {
	State       outbox.State `json:"state"`
	LeaseToken  int64        `json:"lease_token"`
	SubjectRef  string       `json:"subject_ref"`
	ProviderRef *string      `json:"provider_ref,omitempty"`
}

// ExpectedOf returns the expected-state map of row as read now: its state,
// lease token and subject ref, and its provider ref when it has one. Build
// it from the screen the operator decided on; a row that moves afterwards
// is then refused.
func ExpectedOf(row outbox.Row) Expected {
	e := Expected{State: row.State, LeaseToken: row.LeaseToken, SubjectRef: row.SubjectRef}
	if row.ProviderRef != nil {
		p := *row.ProviderRef
		e.ProviderRef = &p
	}
	return e
}

// validate returns *InvalidExpectedError when e is incomplete or does not
// name from, the only state the action starts from.
func (e Expected) validate(from outbox.State) error {
	switch {
	case e.State == "":
		return &InvalidExpectedError{Field: "state", Reason: "is required"}
	case !e.State.Valid():
		return &InvalidExpectedError{Field: "state", Reason: "\"" + string(e.State) + "\" is not a state"}
	case e.State != from:
		return &InvalidExpectedError{Field: "state", Reason: "this action applies only to " + string(from) + " items, not " + string(e.State)}
	case strings.TrimSpace(e.SubjectRef) == "":
		return &InvalidExpectedError{Field: "subject_ref", Reason: "is required"}
	case e.ProviderRef != nil && strings.TrimSpace(*e.ProviderRef) == "":
		return &InvalidExpectedError{Field: "provider_ref", Reason: "must not be blank when given"}
	}
	return nil
}

// diff returns the names of the expected fields that differ from row, in a
// fixed order (state, lease_token, subject_ref, provider_ref).
func (e Expected) diff(row outbox.Row) []string {
	var out []string
	if e.State != row.State {
		out = append(out, "state")
	}
	if e.LeaseToken != row.LeaseToken {
		out = append(out, "lease_token")
	}
	if e.SubjectRef != row.SubjectRef {
		out = append(out, "subject_ref")
	}
	if e.ProviderRef != nil && (row.ProviderRef == nil || *row.ProviderRef != *e.ProviderRef) {
		out = append(out, "provider_ref")
	}
	return out
}

// Snapshot is what a recovery call observed of the row when it decided
// (recovery_actions.observed): the fields Expected compares plus the ones an
// operator reads to decide.
type Snapshot struct {
	State            outbox.State   `json:"state"`
	LeaseToken       int64          `json:"lease_token"`
	SubjectRef       string         `json:"subject_ref"`
	ProviderRef      *string        `json:"provider_ref"`
	QuarantineReason *outbox.Reason `json:"quarantine_reason"`
	MappingVersion   int32          `json:"mapping_version"`
	// CurrentMappingVersion is the feature's mapping version on the item's
	// destination account when the call decided (0 = not mapped); set by
	// requeue, which compares it.
	CurrentMappingVersion *int32 `json:"current_mapping_version,omitempty"`
	// Watermark is the feature's cutover watermark for the item's tenant
	// when the call decided; set by a requeue of a period_buffered item.
	Watermark      *time.Time `json:"watermark,omitempty"`
	Attempts       int32      `json:"attempts"`
	IdempotencyKey string     `json:"idempotency_key"`
	UpdatedAt      time.Time  `json:"updated_at"`
}

// Observe returns the snapshot of row.
func Observe(row outbox.Row) Snapshot {
	return Snapshot{
		State: row.State, LeaseToken: row.LeaseToken, SubjectRef: row.SubjectRef, ProviderRef: row.ProviderRef,
		QuarantineReason: row.QuarantineReason, MappingVersion: row.MappingVersion, Attempts: row.Attempts,
		IdempotencyKey: row.IdempotencyKey, UpdatedAt: row.UpdatedAt.UTC(),
	}
}
