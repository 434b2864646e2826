package stripeemulator

import (
	"encoding/json"
	"math/big"
	"net/http"
	"slices"
	"time"
)

// Outcome is how the emulator answered one request.
type Outcome string

// Outcomes, one per request.
const (
	// OutcomeApplied: a meter event was applied (200).
	OutcomeApplied Outcome = "applied"
	// OutcomeOK: any other 2xx (customers, meters, summaries, adjustments).
	OutcomeOK Outcome = "ok"
	// OutcomeReplayed: a saved idempotent result was replayed.
	OutcomeReplayed Outcome = "replayed"
	// OutcomeDuplicate: Stripe's duplicate-identifier 400; nothing applied.
	OutcomeDuplicate Outcome = "duplicate"
	// OutcomeInvalid: any other 4xx (validation, configuration cause, 404).
	OutcomeInvalid Outcome = "invalid"
	// OutcomeErrorReported: 200 answered but not applied; an ErrorReport
	// was recorded (Config.AsyncValidation).
	OutcomeErrorReported Outcome = "error_reported"
	// OutcomeUnauthorized: 401, missing or unknown API key.
	OutcomeUnauthorized Outcome = "unauthorized"
	// OutcomeForbidden: 403, key without permission.
	OutcomeForbidden Outcome = "forbidden"
	// OutcomeOverlap: 429, a second concurrent call for a (customer, meter).
	OutcomeOverlap Outcome = "overlap"
	// OutcomeRateLimited: 429 injected by a fault or script.
	OutcomeRateLimited Outcome = "rate_limited"
	// OutcomeServerError: 500 injected by a fault or script.
	OutcomeServerError Outcome = "server_error"
	// OutcomeIdempotencyMismatch: 400 idempotency_error, same key with
	// different parameters.
	OutcomeIdempotencyMismatch Outcome = "idempotency_mismatch"
	// OutcomeKeyInUse: 409 idempotency_key_in_use.
	OutcomeKeyInUse Outcome = "key_in_use"
	// OutcomeDropped: the connection was closed without a response (before
	// or after applying; see Applied for which).
	OutcomeDropped Outcome = "dropped"
	// OutcomeTimeout: held unanswered until the client gave up.
	OutcomeTimeout Outcome = "timeout"
)

// AppliedEvent is one meter event the emulator effectively applied.
type AppliedEvent struct {
	Identifier  string
	EventName   string
	MeterID     string
	Customer    string
	Value       float64   // payload[<value key>] parsed as a decimal number (exact for integers; ExactValue always)
	exact       *big.Rat  // the same value, exactly; never mutated
	Timestamp   time.Time // the event's timestamp (second precision, UTC)
	ReceivedAt  time.Time // the emulator clock when applied
	Cancelled   bool      // cancelled by a meter event adjustment
	CancelledAt time.Time // zero unless Cancelled
}

// ErrorReport is a meter event answered 200 but rejected asynchronously
// (Config.AsyncValidation), as Stripe reports in
// v1.billing.meter.error_report_triggered. No customer id is kept.
type ErrorReport struct {
	Identifier string
	EventName  string
	Code       string // CodeNoMeter, CodeCustomerNotFound, …
	ReceivedAt time.Time
}

// ErrorReports returns the asynchronous rejections, oldest first.
func (e *Emulator) ErrorReports() []ErrorReport {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.reports)
}

// RequestRecord is one request as the emulator saw it. It carries no
// payload and no customer id: the body is kept as its SHA-256.
type RequestRecord struct {
	Seq            uint64
	Route          Route
	RequestID      string
	Identifier     string   // meter events and adjustments (a stream request: its first event); "" otherwise
	Identifiers    []string // a stream request: every event identifier, in order; nil otherwise
	IdempotencyKey string   // the Idempotency-Key header, "" if absent
	BodySHA256     [32]byte // of the raw request body (POST); zero for GET
	Status         int      // HTTP status; 0 when the connection was closed without a response
	Outcome        Outcome
	ReceivedAt     time.Time
}

// record appends to the request log and counts the outcome.
func (e *Emulator) record(c *call, status int, outcome Outcome) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.seq++
	e.counts[outcome]++
	if e.cfg.RequestLogLimit <= 0 {
		return
	}
	// The log keeps up to twice the limit and drops the oldest half at
	// once, so recording stays O(1) amortised (dropping one record per
	// request copied the whole log on every call: 17 % of the demo's CPU,
	// measured). requestLog is the window of the newest limit records.
	if len(e.requests) >= 2*e.cfg.RequestLogLimit {
		n := len(e.requests) - e.cfg.RequestLogLimit
		e.requests = append(e.requests[:0], e.requests[n:]...)
	}
	e.requests = append(e.requests, RequestRecord{
		Seq: e.seq, Route: c.route, RequestID: c.requestID, Identifier: c.identifier, Identifiers: c.identifiers,
		IdempotencyKey: c.idemKey, BodySHA256: c.bodySum, Status: status, Outcome: outcome, ReceivedAt: c.received,
	})
}

// Applied returns every applied meter event in order of application,
// cancelled ones included (Cancelled set).
func (e *Emulator) Applied() []AppliedEvent {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.events)
}

// AppliedTotals returns, per event_name, the sum of the values of applied
// events that are not cancelled: what the account would bill, rounded to
// the nearest float64 (exact below 2^53 for integer values). The oracle
// that must be exact uses AppliedTotalsExact.
func (e *Emulator) AppliedTotals() map[string]float64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[string]float64, len(e.totals))
	for k, v := range e.totals {
		out[k] = ratFloat(v)
	}
	return out
}

// AppliedTotalsExact is AppliedTotals without rounding: the sums are kept
// as exact rationals of the decimal values applied.
func (e *Emulator) AppliedTotalsExact() map[string]*big.Rat {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[string]*big.Rat, len(e.totals))
	for k, v := range e.totals {
		out[k] = new(big.Rat).Set(v)
	}
	return out
}

// AppliedCount returns len(Applied()) without copying: applied meter
// events, cancelled included. O(1), cheap to poll.
func (e *Emulator) AppliedCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.events)
}

// InFlight returns the meter event calls holding a (customer, meter) slot
// now. O(1), cheap to poll.
func (e *Emulator) InFlight() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.inflightN
}

// DuplicateApplications returns the identifiers applied more than once (in
// the order their second application happened). It is empty while dedupe
// works; an identifier resent after its dedupe window is applied again and
// shows up here, as it would be billed twice at Stripe.
func (e *Emulator) DuplicateApplications() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.duplicates)
}

// Applications returns how many times identifier was applied.
func (e *Emulator) Applications(identifier string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.ids[identifier].applications
}

// Overlaps returns how many meter event requests arrived while another for
// the same (customer, meter) was in flight (each answered 429 unless
// Config.AllowConcurrent).
func (e *Emulator) Overlaps() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.overlaps
}

// OverlapsFor is Overlaps for one (event_name, customer) pair.
func (e *Emulator) OverlapsFor(eventName, customer string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	m, ok := e.byEvent[eventName]
	if !ok {
		return 0
	}
	return e.overlapsPair[pairKey{m.ID, customer}]
}

// Counts returns the number of requests per outcome (all endpoints).
func (e *Emulator) Counts() map[Outcome]int {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[Outcome]int, len(e.counts))
	for k, v := range e.counts {
		out[k] = v
	}
	return out
}

// Requests returns the request log, oldest first (at most
// Config.RequestLogLimit records; older ones are dropped).
func (e *Emulator) Requests() []RequestRecord {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.requestLog())
}

// requestLog is the newest Config.RequestLogLimit records (e.mu held).
func (e *Emulator) requestLog() []RequestRecord {
	return e.requests[max(0, len(e.requests)-e.cfg.RequestLogLimit):]
}

// RequestsFor returns the logged requests carrying identifier, oldest first.
func (e *Emulator) RequestsFor(identifier string) []RequestRecord {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []RequestRecord
	for _, r := range e.requestLog() {
		if r.Identifier == identifier || slices.Contains(r.Identifiers, identifier) {
			out = append(out, r)
		}
	}
	return out
}

// Stats is a summary for the demo and `GET /_emulator/stats`. It carries
// no customer id and no payload.
type Stats struct {
	Requests              uint64             `json:"requests"`               // all requests answered (or dropped)
	Outcomes              map[Outcome]int    `json:"outcomes"`               // requests per outcome
	Applied               int                `json:"applied"`                // applied meter events, cancelled included
	Cancelled             int                `json:"cancelled"`              // of which cancelled
	AppliedTotals         map[string]float64 `json:"applied_totals"`         // per event_name, cancelled excluded
	DuplicateApplications int                `json:"duplicate_applications"` // identifiers applied more than once
	Overlaps              int                `json:"overlaps"`               // concurrent calls per (customer, meter)
	InFlight              int                `json:"in_flight"`              // meter event calls holding a (customer, meter) slot now
	Executing             int                `json:"executing"`              // calls executing under an Idempotency-Key now
	Faults                string             `json:"faults"`                 // the random faults, ParseFaults syntax
	Sessions              int                `json:"sessions"`               // v2 meter event sessions created
	StreamEvents          int                `json:"stream_events"`          // events in processed stream requests
	StreamDuplicates      int                `json:"stream_duplicates"`      // of which not applied again (identifier within the dedupe window)
	ErrorReports          int                `json:"error_reports"`          // asynchronous rejections recorded
}

// Stats returns the current summary. Its cost does not grow with the
// number of events (counters are kept as requests happen), so it is cheap
// to poll.
func (e *Emulator) Stats() Stats {
	totals := e.AppliedTotals()
	counts := e.Counts()
	e.mu.Lock()
	defer e.mu.Unlock()
	return Stats{
		Requests: e.seq, Outcomes: counts, Applied: len(e.events), Cancelled: e.cancelledN, AppliedTotals: totals,
		DuplicateApplications: len(e.duplicates), Overlaps: e.overlaps, InFlight: e.inflightN, Executing: e.executingN,
		Faults: e.faults.String(), Sessions: e.sessionsN, StreamEvents: e.streamEvents, StreamDuplicates: e.streamDupes,
		ErrorReports: len(e.reports),
	}
}

// handleStats serves Stats as JSON, unauthenticated (no secrets, no
// customer ids, no payloads).
func (e *Emulator) handleStats(w http.ResponseWriter, _ *http.Request) {
	b, _ := json.Marshal(e.Stats()) // maps of strings and numbers only
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}
