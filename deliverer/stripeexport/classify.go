package stripeexport

import (
	"fmt"
	"slices"
	"strings"

	"github.com/aurora-billing/aurora/deliverer"
	"github.com/aurora-billing/aurora/shared/outbox"
)

// Transport kinds of an Answer without an HTTP status.
const (
	TransportTimeout    = "timeout"    // the call's deadline or the HTTP timeout passed
	TransportConnection = "connection" // refused, reset, or dropped (also after Stripe applied it)
)

// DuplicateIdentifierMessage starts Stripe's 400 for a meter event whose
// identifier it already has (reported by a public project, not stated in
// Stripe's docs, so unverified; the emulator answers the same).
const DuplicateIdentifierMessage = "An event already exists with identifier"

// Answer is what one call produced, before classification.
type Answer struct {
	Status    int    // HTTP status; 0 when no HTTP answer arrived
	Transport string // "" | TransportTimeout | TransportConnection (only when Status == 0)
	Type      string // Stripe error type, e.g. "invalid_request_error", "idempotency_error"
	Code      string // Stripe error code, e.g. "rate_limit", "no_meter"
	Param     string // Stripe error param, e.g. "payload[stripe_customer_id]"
	Message   string // Stripe error message
	RequestID string // Request-Id header
}

// Rule is one row of THE classification table: the first row whose Match
// holds decides the outcome.
type Rule struct {
	Name    string            // stable name, stored in last_error and logs
	When    string            // the condition in words (docs/deliverer.md)
	Outcome deliverer.Outcome // what the deliverer does
	Reason  outbox.Reason     // quarantine reason (OutcomeQuarantined only)
	Why     string            // the source or reasoning
	Match   func(Answer) bool
}

func status(codes ...int) func(Answer) bool {
	return func(a Answer) bool { return slices.Contains(codes, a.Status) }
}

func code(statuses []int, codes ...string) func(Answer) bool {
	return func(a Answer) bool { return slices.Contains(statuses, a.Status) && slices.Contains(codes, a.Code) }
}

// Rules returns the classification table in match order. It is the only
// place a Stripe answer becomes an outcome (one answer table, as River keeps one job-state table); each row is tested
// by name and rendered into docs/deliverer.md by MarkdownTable.
func Rules() []Rule {
	bad := []int{400, 404}
	return []Rule{
		{Name: "timeout", When: "no answer before the deadline (AURORA_STRIPE_TIMEOUT_SECONDS)", Outcome: deliverer.OutcomeRetry,
			Why:   "it may have applied; the same key makes the retry collapse onto it",
			Match: func(a Answer) bool { return a.Status == 0 && a.Transport == TransportTimeout }},
		{Name: "connection_error", When: "connection refused, reset or dropped, including dropped after Stripe applied it", Outcome: deliverer.OutcomeRetry,
			Why:   "same as timeout: retry with the same key and byte-identical body",
			Match: func(a Answer) bool { return a.Status == 0 }},
		{Name: "http_2xx", When: "200 (any 2xx)", Outcome: deliverer.OutcomeAccepted,
			Why:   "Stripe took it; provider_ref = Request-Id (or the identifier)",
			Match: func(a Answer) bool { return a.Status >= 200 && a.Status < 300 }},
		{Name: "duplicate_identifier", When: "400 whose message starts \"" + DuplicateIdentifierMessage + "\"", Outcome: deliverer.OutcomeAccepted,
			Why: "Stripe already has an event with this identifier, i.e. an earlier attempt landed (the message a public project reports; not in Stripe's docs)",
			Match: func(a Answer) bool {
				return a.Status == 400 && strings.Contains(a.Message, DuplicateIdentifierMessage)
			}},
		{Name: "idempotency_error", When: "type idempotency_error (same key, different parameters)", Outcome: deliverer.OutcomeUncertain,
			Why:   "the key was used with other parameters: we cannot tell what Stripe recorded",
			Match: func(a Answer) bool { return a.Type == "idempotency_error" }},
		{Name: "idempotency_key_in_use", When: "409 (idempotency_key_in_use: the key's first request still runs)", Outcome: deliverer.OutcomeRetry,
			Why: "the first request is still executing; retry later with the same key", Match: status(409)},
		{Name: "rate_limited", When: "429 (rate_limit, also a concurrent call for the same customer and meter)", Outcome: deliverer.OutcomeRetry,
			Why: "429s are decided before the idempotency layer: nothing was processed", Match: status(429)},
		{Name: "server_error", When: "500–599", Outcome: deliverer.OutcomeRetry,
			Why:   "Stripe failed; a replay of the same key returns Stripe's saved answer or executes it once",
			Match: func(a Answer) bool { return a.Status >= 500 && a.Status <= 599 }},
		{Name: "unauthorized", When: "401, 403", Outcome: deliverer.OutcomeQuarantined, Reason: outbox.ReasonAccountUnconfirmed,
			Why: "the key is not valid for the account: a configuration problem, not the item's", Match: status(401, 403)},
		{Name: "customer_unknown", When: "400/404 with code meter_event_customer_not_found or meter_event_no_customer_defined, or resource_missing on a customer param", Outcome: deliverer.OutcomeQuarantined, Reason: outbox.ReasonCustomerMissing,
			Why: "Stripe names the customer as the cause (meter error report codes)",
			Match: func(a Answer) bool {
				return code(bad, "meter_event_customer_not_found", "meter_event_no_customer_defined")(a) ||
					(slices.Contains(bad, a.Status) && a.Code == "resource_missing" && strings.Contains(a.Param, "customer"))
			}},
		{Name: "meter_unknown", When: "400/404 with code no_meter or archived_meter", Outcome: deliverer.OutcomeQuarantined, Reason: outbox.ReasonProviderConfiguration,
			Why: "the mapping names an event_name no active Stripe meter has", Match: code(bad, "no_meter", "archived_meter")},
		{Name: "payload_mismatch", When: "400/404 with code meter_event_value_not_found or meter_event_invalid_value", Outcome: deliverer.OutcomeQuarantined, Reason: outbox.ReasonProviderConfiguration,
			Why: "the mapping's customer/value keys differ from the meter's", Match: code(bad, "meter_event_value_not_found", "meter_event_invalid_value")},
		{Name: "timestamp_window", When: "400/404 with code timestamp_too_far_in_past or timestamp_in_future", Outcome: deliverer.OutcomeQuarantined, Reason: outbox.ReasonTimestampOutsideWindow,
			Why: "Stripe's 35 days / 5 minutes window; the timestamp is never rewritten", Match: code(bad, "timestamp_too_far_in_past", "timestamp_in_future")},
		{Name: "invalid_request", When: "any other 400 or 404", Outcome: deliverer.OutcomeRejected,
			Why: "Stripe refused this request as it stands", Match: status(400, 404)},
		{Name: "other_4xx", When: "any other 4xx (402, 405, 413, …)", Outcome: deliverer.OutcomeRejected,
			Why:   "a client error Stripe will answer the same way every time",
			Match: func(a Answer) bool { return a.Status >= 400 && a.Status <= 499 }},
		{Name: "unexpected", When: "anything else (1xx, 3xx)", Outcome: deliverer.OutcomeUncertain,
			Why: "an answer we cannot read: nobody knows whether it landed", Match: func(Answer) bool { return true }},
	}
}

// Classify returns the first rule of Rules that matches a.
func Classify(a Answer) Rule { return classify(Rules(), a) }

// classify returns the first rule of rules that matches a (an Exporter
// builds Rules once and classifies every answer against its copy).
func classify(rules []Rule, a Answer) Rule {
	for _, r := range rules {
		if r.Match(a) {
			return r
		}
	}
	panic("stripeexport: the table's last rule matches everything")
}

// MarkdownTable renders Rules as the table in docs/deliverer.md (a test
// keeps the two identical).
func MarkdownTable() string {
	var b strings.Builder
	b.WriteString("| # | rule | Stripe answer | outcome | why |\n|---|---|---|---|---|\n")
	for i, r := range Rules() {
		out := string(r.Outcome)
		if r.Outcome == deliverer.OutcomeQuarantined {
			out += " (" + string(r.Reason) + ")"
		}
		fmt.Fprintf(&b, "| %d | `%s` | %s | %s | %s |\n", i+1, r.Name, r.When, out, r.Why)
	}
	return b.String()
}
