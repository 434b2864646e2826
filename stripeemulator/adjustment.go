package stripeemulator

import (
	"net/http"
)

var adjustmentParams = []string{"event_name", "type", "cancel[identifier]", "expand[*]"}

type adjustmentJSON struct {
	Object    string `json:"object"`
	EventName string `json:"event_name"`
	Livemode  bool   `json:"livemode"`
	Status    string `json:"status"`
	Type      string `json:"type"`
	Cancel    struct {
		Identifier string `json:"identifier"`
	} `json:"cancel"`
}

// handleAdjustmentCreate is POST /v1/billing/meter_event_adjustments with
// type=cancel and cancel[identifier]: the event leaves the summaries and
// AppliedTotals at once (Stripe processes it asynchronously and answers
// status "pending"; so does the emulator). Stripe allows a cancel "within 24
// hours of Stripe receiving" the event (Config.CancelWindow).
//
// Answers 400 for: a missing event_name or cancel[identifier]; a type other
// than cancel; an identifier never applied (resource_missing); an
// event_name that is not the event's; an event already cancelled; a cancel
// after the window (meter_event_adjustment_window_passed, the emulator's own
// code).
func (e *Emulator) handleAdjustmentCreate(c *call) reply {
	if ae := checkParams(c.form, adjustmentParams...); ae != nil {
		return errReply(ae, OutcomeInvalid)
	}
	eventName := c.form.Get("event_name")
	if eventName == "" {
		return errReply(invalidRequest(CodeParameterMissing, "event_name", "Missing required param: event_name."), OutcomeInvalid)
	}
	typ := c.form.Get("type")
	if typ == "" {
		typ = "cancel"
	}
	if typ != "cancel" {
		return errReply(invalidRequest(CodeParameterInvalid, "type", "Invalid type: must be cancel"), OutcomeInvalid)
	}
	identifier := c.form.Get("cancel[identifier]")
	if identifier == "" {
		return errReply(invalidRequest(CodeParameterMissing, "cancel[identifier]", "Missing required param: cancel[identifier]."), OutcomeInvalid)
	}
	c.identifier = identifier
	return e.idempotent(c, func() executed {
		e.mu.Lock()
		defer e.mu.Unlock()
		st := e.ids[identifier]
		idx := st.last
		if st.applications == 0 {
			return executed{reply: errReply(invalidRequest(CodeResourceMissing, "cancel[identifier]", "No meter event found with identifier %s.", identifier), OutcomeInvalid)}
		}
		ev := &e.events[idx]
		if ev.EventName != eventName {
			return executed{reply: errReply(invalidRequest(CodeParameterInvalid, "event_name", "The meter event with identifier %s has a different event_name.", identifier), OutcomeInvalid)}
		}
		if ev.Cancelled {
			return executed{reply: errReply(invalidRequest(CodeParameterInvalid, "cancel[identifier]", "The meter event with identifier %s is already cancelled.", identifier), OutcomeInvalid)}
		}
		now := e.cfg.Now()
		if now.Sub(ev.ReceivedAt) > e.cfg.CancelWindow {
			return executed{reply: errReply(invalidRequest(CodeAdjustmentWindowPassed, "cancel[identifier]", "Meter events can only be cancelled within %s of being received.", e.cfg.CancelWindow), OutcomeInvalid)}
		}
		ev.Cancelled, ev.CancelledAt = true, now
		e.cancelledN++
		if e.totals[ev.EventName] != nil {
			e.totals[ev.EventName].Sub(e.totals[ev.EventName], ev.ExactValue())
		}
		body := adjustmentJSON{Object: "billing.meter_event_adjustment", EventName: eventName, Livemode: c.livemode, Status: "pending", Type: "cancel"}
		body.Cancel.Identifier = identifier
		return executed{reply: jsonReply(http.StatusOK, body, OutcomeOK), save: true}
	})
}
