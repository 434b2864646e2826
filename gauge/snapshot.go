package gauge

import (
	"time"

	"github.com/aurora-billing/aurora/shared/outbox"
)

// Snapshot is one measurement of every figure, read in one read-only
// transaction. Its JSON form is `auroractl status --json` (fields are added,
// never renamed).
type Snapshot struct {
	// MeasuredAt is the database clock's now (or the injected clock's) when
	// the figures were read.
	MeasuredAt time.Time `json:"measured_at"`
	// CountCap is Config.CountCap: a count equal to it means "at least".
	CountCap       int            `json:"count_cap"`
	Outbox         Outbox         `json:"outbox"`
	Inbox          Inbox          `json:"inbox"`
	Reconciliation Reconciliation `json:"reconciliation"`
	Events         Events         `json:"events"`
}

// BacklogStates are the states something automatic still moves an item
// out of (a deliverer: pending, leased; the reconciler: accepted). Their
// oldest item's age is the outbox backlog age (seed 000, "What to watch").
var BacklogStates = []outbox.State{outbox.StatePending, outbox.StateLeased, outbox.StateAccepted}

// CountedStates are the states whose items are counted. accepted, confirmed
// and rejected are left out: they hold every item ever sent, so counting
// them costs the table's size.
var CountedStates = []outbox.State{outbox.StatePending, outbox.StateLeased, outbox.StateUncertain, outbox.StateQuarantined}

// ReasonOther labels a quarantine or dead-letter reason this binary does not
// know (written by a newer version, or by hand).
const ReasonOther = "other"

// Outbox is the export outbox's figures (seed 000).
type Outbox struct {
	// BacklogAgeSeconds, for each of BacklogStates: seconds since the oldest
	// item in that state was staged (created_at), 0 when there is none.
	BacklogAgeSeconds map[outbox.State]float64 `json:"backlog_age_seconds"`
	// Items, for each of CountedStates: items in that state, capped at
	// CountCap.
	Items map[outbox.State]int64 `json:"items"`
	// UncertainOldestAgeSeconds: seconds since the oldest uncertain item
	// became uncertain (updated_at: nothing automatic touches an uncertain
	// row), 0 when there is none.
	UncertainOldestAgeSeconds float64 `json:"uncertain_oldest_age_seconds"`
	// QuarantinedByReason: quarantined items by reason, every reason of
	// outbox.Reasons present (0 when none) and ReasonOther; each capped.
	QuarantinedByReason map[string]int64 `json:"quarantined_by_reason"`
	// LastItemID is the highest outbox_items id: it only grows, by one per
	// staged item (and per identity value a rolled-back insert consumed), so
	// its rate is the staging rate.
	LastItemID int64 `json:"last_item_id"`
}

// Inbox is the Stripe webhook inbox's figures (seed 003's read-only
// operator inventory).
type Inbox struct {
	// Pending: events neither processed nor dead-lettered, capped.
	Pending int64 `json:"pending"`
	// DeadLetters: dead-lettered (quarantined) events by last_reason, every
	// reason of inbox.Reasons present and ReasonOther; their total is capped.
	DeadLetters map[string]int64 `json:"dead_letters"`
	// HighestPendingAttempts: the highest attempt count among pending events
	// (dead letters excluded: they stopped at the budget and are counted
	// above), over at most CountCap of them.
	HighestPendingAttempts int64 `json:"highest_pending_attempts"`
	// OldestPendingAgeSeconds: seconds since the oldest pending event was
	// received, 0 when there is none.
	OldestPendingAgeSeconds float64 `json:"oldest_pending_age_seconds"`
}

// DeadLetterTotal is the sum of Inbox.DeadLetters.
func (in Inbox) DeadLetterTotal() int64 {
	var n int64
	for _, v := range in.DeadLetters {
		n += v
	}
	return n
}

// QuarantinedTotal is the sum of Outbox.QuarantinedByReason.
func (o Outbox) QuarantinedTotal() int64 {
	var n int64
	for _, v := range o.QuarantinedByReason {
		n += v
	}
	return n
}

// Reconciliation is the reconciler's open findings (seed 000,
// "Reconciliation": open reconciliation items older than a day are watched).
type Reconciliation struct {
	// OpenByKind: open reconciliation items by kind, every kind of
	// reconciler.Kinds present (0 when none) and ReasonOther; read over the
	// CountCap oldest open items.
	OpenByKind map[string]int64 `json:"open_by_kind"`
	// OldestOpenAgeSecondsByKind: seconds since the oldest open item of each
	// kind was first seen, 0 when none.
	OldestOpenAgeSecondsByKind map[string]float64 `json:"oldest_open_age_seconds_by_kind"`
}

// OpenTotal is the sum of OpenByKind.
func (r Reconciliation) OpenTotal() int64 {
	var n int64
	for _, v := range r.OpenByKind {
		n += v
	}
	return n
}

// OldestOpenAgeSeconds is the largest of OldestOpenAgeSecondsByKind.
func (r Reconciliation) OldestOpenAgeSeconds() float64 {
	var m float64
	for _, v := range r.OldestOpenAgeSecondsByKind {
		m = max(m, v)
	}
	return m
}

// Events is the domain events' figures (seed 004): the producer outbox's
// dispatch backlog and dead letters, and each registered consumer's dead
// letters and catch-up lag. Measured from Postgres, so a consumer that is
// down still shows its lag growing (its own in-process
// aurora_events_consumer_catch_up_lag_seconds stops with it).
type Events struct {
	// UndispatchedOldestAgeSeconds: seconds since the oldest event still
	// pending or failed (not yet on the stream, not dead-lettered) was
	// published by its producer, over at most CountCap of them; 0 when none.
	UndispatchedOldestAgeSeconds float64 `json:"undispatched_oldest_age_seconds"`
	// OutboxDeadLetters: events the dispatcher gave up on, or whose every
	// consumer dead-lettered them (event_outbox.status = dead_letter), capped.
	OutboxDeadLetters int64 `json:"outbox_dead_letters"`
	// ConsumerDeadLetters, for every registered consumer (0 when none):
	// events dead-lettered for that consumer, capped.
	ConsumerDeadLetters map[string]int64 `json:"consumer_dead_letters"`
	// ConsumerLagSeconds, for every registered consumer: seconds since the
	// oldest dispatched event of its types that it has neither processed nor
	// dead-lettered was dispatched; 0 when none. Read over the CountCap
	// oldest dispatched events of its types, so a consumer that processed all
	// of those but not a younger one reads 0 until the older ones are
	// acknowledged (a lower bound, never a false alarm).
	ConsumerLagSeconds map[string]float64 `json:"consumer_lag_seconds"`
}

// ConsumerDeadLetterTotal is the sum of Events.ConsumerDeadLetters.
func (e Events) ConsumerDeadLetterTotal() int64 {
	var n int64
	for _, v := range e.ConsumerDeadLetters {
		n += v
	}
	return n
}

// MaxConsumerLagSeconds is the largest of Events.ConsumerLagSeconds.
func (e Events) MaxConsumerLagSeconds() float64 {
	var m float64
	for _, v := range e.ConsumerLagSeconds {
		m = max(m, v)
	}
	return m
}
