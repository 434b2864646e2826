package stripeexport

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/aurora-billing/aurora/deliverer"
	"github.com/aurora-billing/aurora/shared/outbox"
	stripe "github.com/stripe/stripe-go/v76"
)

// AlreadyCancelledMessage is part of the 400 a cancel of an identifier
// that is already cancelled gets (the emulator's wording; Stripe does not
// document its own, so the rule also matches only this phrase).
const AlreadyCancelledMessage = "is already cancelled"

// AdjustmentWindowPassedCode is the error code of a cancel after the 24 h
// adjustment window (the emulator's own code; Stripe documents the window,
// not the code).
const AdjustmentWindowPassedCode = "meter_event_adjustment_window_passed"

// CancelParams returns the stripe-go parameters of r: type cancel,
// event_name, cancel[identifier] and the Idempotency-Key, a pure function of
// r so every attempt encodes to the same body.
func CancelParams(ctx context.Context, r deliverer.CancelRequest) *stripe.BillingMeterEventAdjustmentParams {
	p := &stripe.BillingMeterEventAdjustmentParams{
		EventName: stripe.String(r.EventName),
		Type:      stripe.String("cancel"),
		Cancel:    &stripe.BillingMeterEventAdjustmentCancelParams{Identifier: stripe.String(r.Identifier)},
	}
	p.Context = ctx
	p.SetIdempotencyKey(r.Key)
	return p
}

// Cancel sends r to POST /v1/billing/meter_event_adjustments and classifies
// the answer with CancelRules. Stream accounts cancel here too: the v2
// meter event stream has no adjustments.
func (e *Exporter) Cancel(ctx context.Context, r deliverer.CancelRequest) deliverer.Result {
	obs := &observation{}
	adj, err := e.adjust.New(CancelParams(context.WithValue(ctx, observationKey{}, obs), r))
	a := answer(ctx, obs, err)
	if err == nil && adj != nil && adj.LastResponse != nil && a.RequestID == "" {
		a.RequestID = adj.LastResponse.RequestID
	}
	rules := e.cancels
	if rules == nil {
		rules = CancelRules()
	}
	rule := classify(rules, a)
	res := deliverer.Result{
		Outcome: rule.Outcome, Reason: rule.Reason, Rule: rule.Name,
		HTTPStatus: a.Status, RequestID: a.RequestID, ErrorCode: a.Code, Message: a.Message,
	}
	if a.Status == 0 {
		res.ErrorCode = a.Transport
	}
	if rule.Outcome == deliverer.OutcomeAccepted {
		res.ProviderRef = r.Key
		if a.RequestID != "" && rule.Name == "cancel_2xx" {
			res.ProviderRef = a.RequestID
		}
	}
	return res
}

// CancelRules returns the classification table of a cancel, in match order
// (rendered into docs/deliverer.md by CancelMarkdownTable). It differs from
// Rules where a cancel differs from a meter event: an identifier already
// cancelled is done (only the correction that names a record cancels it:
// usage.CheckCorrection refuses a second one), and a 4xx that is the
// request's fault quarantines negative_quantity, since the correction can
// then only be credited by a person, never rejected silently.
func CancelRules() []Rule {
	bad := []int{400, 404}
	return []Rule{
		{Name: "cancel_timeout", When: "no answer before the deadline", Outcome: deliverer.OutcomeRetry,
			Why:   "it may have applied; the same Idempotency-Key replays Stripe's saved answer",
			Match: func(a Answer) bool { return a.Status == 0 && a.Transport == TransportTimeout }},
		{Name: "cancel_connection_error", When: "connection refused, reset or dropped", Outcome: deliverer.OutcomeRetry,
			Why: "same as a timeout: retry with the same key", Match: func(a Answer) bool { return a.Status == 0 }},
		{Name: "cancel_2xx", When: "200 (any 2xx), also a replay of the same Idempotency-Key", Outcome: deliverer.OutcomeAccepted,
			Why:   "Stripe took the cancel (status pending: it is applied asynchronously)",
			Match: func(a Answer) bool { return a.Status >= 200 && a.Status < 300 }},
		{Name: "cancel_already_cancelled", When: "400 whose message contains \"" + AlreadyCancelledMessage + "\" (a cancel with another key after one applied)", Outcome: deliverer.OutcomeAccepted,
			Why: "the event is cancelled already, which is what the cancel wants",
			Match: func(a Answer) bool {
				return a.Status == 400 && strings.Contains(a.Message, AlreadyCancelledMessage)
			}},
		{Name: "cancel_idempotency_error", When: "type idempotency_error (same key, different parameters)", Outcome: deliverer.OutcomeUncertain,
			Why:   "the key was used with other parameters: we cannot tell what Stripe did",
			Match: func(a Answer) bool { return a.Type == "idempotency_error" }},
		{Name: "cancel_key_in_use", When: "409", Outcome: deliverer.OutcomeRetry,
			Why: "the first request with the key still runs", Match: status(409)},
		{Name: "cancel_rate_limited", When: "429", Outcome: deliverer.OutcomeRetry,
			Why: "nothing was processed", Match: status(429)},
		{Name: "cancel_server_error", When: "500–599", Outcome: deliverer.OutcomeRetry,
			Why:   "Stripe failed; the same key replays its saved answer or executes once",
			Match: func(a Answer) bool { return a.Status >= 500 && a.Status <= 599 }},
		{Name: "cancel_unauthorized", When: "401, 403", Outcome: deliverer.OutcomeQuarantined, Reason: outbox.ReasonAccountUnconfirmed,
			Why: "the key is not valid for the account", Match: status(401, 403)},
		{Name: "cancel_window_passed", When: "400/404 with code " + AdjustmentWindowPassedCode, Outcome: deliverer.OutcomeQuarantined, Reason: outbox.ReasonNegativeQuantity,
			Why: "Stripe received the event more than 24 h ago: a person credits the correction", Match: code(bad, AdjustmentWindowPassedCode)},
		{Name: "cancel_meter_unknown", When: "400/404 with code no_meter or archived_meter, or a parameter_invalid_* code on param event_name", Outcome: deliverer.OutcomeQuarantined, Reason: outbox.ReasonProviderConfiguration,
			Why: "the mapping's event_name is not the cancelled event's meter",
			Match: func(a Answer) bool {
				return code(bad, "no_meter", "archived_meter")(a) || (slices.Contains(bad, a.Status) && strings.HasPrefix(a.Code, "parameter_invalid") && a.Param == "event_name")
			}},
		{Name: "cancel_identifier_unknown", When: "400/404 with code resource_missing", Outcome: deliverer.OutcomeQuarantined, Reason: outbox.ReasonNegativeQuantity,
			Why: "Stripe has no event with the corrected record's identifier: nothing to cancel automatically", Match: code(bad, "resource_missing")},
		{Name: "cancel_refused", When: "any other 4xx", Outcome: deliverer.OutcomeQuarantined, Reason: outbox.ReasonNegativeQuantity,
			Why:   "Stripe refused this cancel as it stands: a person looks before anything is credited",
			Match: func(a Answer) bool { return a.Status >= 400 && a.Status <= 499 }},
		{Name: "cancel_unexpected", When: "anything else (1xx, 3xx)", Outcome: deliverer.OutcomeUncertain,
			Why: "an answer we cannot read", Match: func(Answer) bool { return true }},
	}
}

// CancelMarkdownTable renders CancelRules as the cancel table in
// docs/deliverer.md (a test keeps the two identical).
func CancelMarkdownTable() string {
	var b strings.Builder
	b.WriteString("| # | rule | Stripe answer to the cancel | outcome | why |\n|---|---|---|---|---|\n")
	for i, r := range CancelRules() {
		out := string(r.Outcome)
		if r.Outcome == deliverer.OutcomeQuarantined {
			out += " (" + string(r.Reason) + ")"
		}
		fmt.Fprintf(&b, "| %d | `%s` | %s | %s | %s |\n", i+1, r.Name, r.When, out, r.Why)
	}
	return b.String()
}
