package events

// Status is an event_outbox row's status (seed 004, "Outbox Status
// Lifecycle"). The same six values are a CHECK constraint on
// event_outbox.status.
type Status string

const (
	// StatusPending: written by Publish in the producer's transaction, not
	// yet dispatched. In: Publish; an operator requeue of a dispatch dead
	// letter. Out: a dispatcher claim (to dispatching).
	StatusPending Status = "pending"
	// StatusDispatching: a dispatcher claimed it (attempts + 1, a lease) and
	// is publishing it. Out: the PubAck (to dispatched), a failed publish
	// (to failed or dead_letter), or a new claim once the lease has expired
	// (a dispatcher died mid-publish). A consumer that processed it before
	// the dispatcher recorded the PubAck may acknowledge it from here.
	StatusDispatching Status = "dispatching"
	// StatusDispatched: JetStream acknowledged the publish; waiting for the
	// consumers. The catch-up loop lists only these. Out: the last
	// registered consumer's processed inbox row (to acknowledged), every
	// unprocessed consumer dead-lettering it (to dead_letter).
	StatusDispatched Status = "dispatched"
	// StatusAcknowledged: every consumer registered for the event's type
	// processed it. Terminal; excluded from catch-up. In: a consumer's
	// processed inbox row, or `auroractl events cleanup-stuck --yes`. Out:
	// only Purge, after the retention period.
	StatusAcknowledged Status = "acknowledged"
	// StatusFailed: a publish failed; eligible for retry at next_attempt_at.
	// In: the dispatcher. Out: a dispatcher claim.
	StatusFailed Status = "failed"
	// StatusDeadLetter: the dispatch exceeded its attempt budget, or every
	// registered consumer that has not processed it dead-lettered it. Out:
	// only an operator requeue (auroractl events requeue).
	StatusDeadLetter Status = "dead_letter"
)

// Statuses lists the six outbox statuses in the seed's order.
var Statuses = []Status{StatusPending, StatusDispatching, StatusDispatched, StatusAcknowledged, StatusFailed, StatusDeadLetter}

// Valid reports whether s is one of the six statuses.
func (s Status) Valid() bool {
	switch s {
	case StatusPending, StatusDispatching, StatusDispatched, StatusAcknowledged, StatusFailed, StatusDeadLetter:
		return true
	default:
		return false
	}
}

// InboxStatus is an event_inbox row's status, or the outcome of a claim
// (seed 004, "Inbox Status Lifecycle"). The same four values are a CHECK
// constraint on event_inbox.status.
type InboxStatus string

const (
	// InboxProcessing: the consumer claimed the event (the INSERT, or the
	// retry of a failed row) and its handler is running, in the same
	// transaction. Out: processed before commit; a rollback removes the
	// claim (the failure is then recorded as failed).
	InboxProcessing InboxStatus = "processing"
	// InboxProcessed: the handler's transaction committed with this row.
	// Terminal: every later delivery is a duplicate.
	InboxProcessed InboxStatus = "processed"
	// InboxFailed: the handler failed; attempts, last_error and
	// next_attempt_at say when it is tried again. Dead-lettered
	// (dead_lettered_at set, with dead_letter_reason) once attempts reach
	// the budget or JetStream reports the message's deliveries exhausted.
	// Out: a retry claim (to processing), an operator requeue (a fresh
	// budget).
	InboxFailed InboxStatus = "failed"
	// InboxDuplicate: a second claim of the same (consumer, event): the key
	// is taken by a processed row (a real-time and a catch-up delivery, two
	// replicas at once). Skipped silently, no side effect; the processed
	// row's duplicate_deliveries counts it. A claim outcome, never a row's
	// stored status.
	InboxDuplicate InboxStatus = "duplicate"
)

// InboxStatuses lists the four inbox statuses in the seed's order.
var InboxStatuses = []InboxStatus{InboxProcessing, InboxProcessed, InboxFailed, InboxDuplicate}

// Reason is a machine-readable cause stored in event_outbox.last_reason or
// event_inbox.dead_letter_reason.
type Reason string

const (
	// ReasonPublishFailed: JetStream refused the publish or no PubAck came
	// in time (event_outbox.last_reason of a failed row).
	ReasonPublishFailed Reason = "publish_failed"
	// ReasonDispatchExhausted: publishes failed
	// AURORA_EVENTS_DISPATCH_MAX_ATTEMPTS times (a dead_letter outbox row).
	ReasonDispatchExhausted Reason = "dispatch_exhausted"
	// ReasonConsumersDeadLettered: every registered consumer that has not
	// processed the event dead-lettered it (a dead_letter outbox row).
	ReasonConsumersDeadLettered Reason = "consumers_dead_lettered"
	// ReasonHandlerExhausted: the handler failed
	// AURORA_EVENTS_CONSUMER_MAX_ATTEMPTS times (an inbox dead letter).
	ReasonHandlerExhausted Reason = "handler_exhausted"
	// ReasonMaxDeliveries: JetStream delivered the message MaxDeliver times
	// without an ack and said so in its MAX_DELIVERIES advisory (a handler
	// that kills its process never records a failure itself).
	ReasonMaxDeliveries Reason = "max_deliveries"
)

// Reasons lists every reason.
var Reasons = []Reason{ReasonPublishFailed, ReasonDispatchExhausted, ReasonConsumersDeadLettered, ReasonHandlerExhausted, ReasonMaxDeliveries}
