package stripeemulator

import (
	"math/big"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// MaxIdentifierLength is Stripe's limit on a meter event identifier.
const MaxIdentifierLength = 100

var meterEventParams = []string{"event_name", "identifier", "payload[*]", "timestamp", "expand[*]"}

// decimal is the accepted shape of a payload value.
var decimal = regexp.MustCompile(`^-?[0-9]+(\.[0-9]+)?$`)

type meterEventJSON struct {
	Object     string            `json:"object"`
	Created    int64             `json:"created"`
	EventName  string            `json:"event_name"`
	Identifier string            `json:"identifier"`
	Livemode   bool              `json:"livemode"`
	Payload    map[string]string `json:"payload"`
	Timestamp  int64             `json:"timestamp"`
}

// handleMeterEventCreate is POST /v1/billing/meter_events. Order, as at
// Stripe: parameter validation, the live-mode concurrency limiter (429, not
// saved), injected faults, the idempotency layer, then execution (dedupe,
// configuration checks, timestamp window, apply).
func (e *Emulator) handleMeterEventCreate(c *call) reply {
	if ae := checkParams(c.form, meterEventParams...); ae != nil {
		return errReply(ae, OutcomeInvalid)
	}
	eventName := c.form.Get("event_name")
	if eventName == "" {
		return errReply(invalidRequest(CodeParameterMissing, "event_name", "Missing required param: event_name."), OutcomeInvalid)
	}
	payload := nested(c.form, "payload")
	if len(payload) == 0 {
		return errReply(invalidRequest(CodeParameterMissing, "payload", "Missing required param: payload."), OutcomeInvalid)
	}
	ts, hasTS, ae := intParam(c.form, "timestamp")
	if ae != nil {
		return errReply(ae, OutcomeInvalid)
	}
	// A clone: the parsed value is a substring of the whole body, which
	// would otherwise stay alive as long as the identifier is remembered.
	identifier := strings.Clone(c.form.Get("identifier"))
	if len(identifier) > MaxIdentifierLength {
		return errReply(invalidRequest(CodeParameterInvalid, "identifier", "Invalid identifier: must be at most %d characters", MaxIdentifierLength), OutcomeInvalid)
	}

	e.mu.Lock()
	if identifier == "" { // "If not provided, one will be generated."
		identifier = e.newID("mevt_", 24)
	}
	c.identifier = identifier
	// Live mode: one concurrent call per (customer, meter).
	var pk pairKey
	holding := false
	if m := e.meterForEvent(eventName); m != nil {
		if cust := payload[m.CustomerKey]; cust != "" {
			pk = pairKey{m.ID, cust}
			if e.inflight[pk] > 0 {
				e.overlaps++
				e.overlapsPair[pk]++
				if !e.cfg.AllowConcurrent {
					e.mu.Unlock()
					return errReply(&apiError{Status: http.StatusTooManyRequests, Type: TypeInvalidRequestError, Code: CodeRateLimit,
						Message: "Too many concurrent requests for this customer and meter. Only one concurrent meter event call per customer per meter is allowed; back off and retry."}, OutcomeOverlap)
				}
			}
			e.inflight[pk]++
			e.inflightN++
			holding = true
		}
	}
	st := e.ids[identifier]
	n := st.attempts
	st.attempts++
	e.ids[identifier] = st
	var answer Answer
	if q := e.scripts[identifier]; len(q) > 0 {
		answer = q[0]
		if len(q) == 1 {
			delete(e.scripts, identifier)
		} else {
			e.scripts[identifier] = q[1:]
		}
	} else {
		answer = e.faults.decide(e.cfg.Seed, identifier, n)
	}
	latency := e.faults.latency(e.cfg.Seed, identifier, n)
	e.mu.Unlock()

	release := func() {
		if holding {
			e.mu.Lock()
			e.inflightN--
			if e.inflight[pk]--; e.inflight[pk] <= 0 {
				delete(e.inflight, pk)
			}
			e.mu.Unlock()
			holding = false
		}
	}
	defer release()

	// The latency is spent whether or not the client is still waiting: like
	// Stripe, the emulator processes a request it has received. For answers
	// that reach execution it is spent inside it, while the Idempotency-Key
	// is marked running.
	executes := answer.Kind == AnswerNormal || answer.Kind == AnswerHTTP500Saved || answer.Kind == AnswerDropAfterApply || answer.Kind == AnswerCutAfterApply
	if latency > 0 && !executes {
		time.Sleep(latency)
	}

	switch answer.Kind {
	case AnswerHTTP429:
		return errReply(&apiError{Status: http.StatusTooManyRequests, Type: TypeInvalidRequestError, Code: CodeRateLimit,
			Message: "Request rate limit exceeded. Learn more about rate limits here https://stripe.com/docs/rate-limits."}, OutcomeRateLimited)
	case AnswerHTTP500:
		return errReply(serverError(), OutcomeServerError)
	case AnswerHTTP409:
		return errReply(&apiError{Status: http.StatusConflict, Type: TypeInvalidRequestError, Code: CodeIdempotencyKeyInUse,
			Message: "There is currently another in-progress request using this idempotent key. Please try again later."}, OutcomeKeyInUse)
	case AnswerHTTP400:
		return errReply(invalidRequest(answer.Code, "", "Injected error (%s).", answer.Code), OutcomeInvalid)
	case AnswerHTTP401, AnswerSessionExpired:
		return errReply(&apiError{Status: http.StatusUnauthorized, Type: TypeInvalidRequestError, Message: "Invalid API Key provided: " + redactKey(c.apiKey)}, OutcomeUnauthorized)
	case AnswerHTTP403:
		return errReply(&apiError{Status: http.StatusForbidden, Type: TypeInvalidRequestError,
			Message: "The provided key '" + redactKey(c.apiKey) + "' does not have the required permissions for this endpoint."}, OutcomeForbidden)
	case AnswerDrop:
		release()
		e.abort(c, OutcomeDropped)
		return reply{}
	case AnswerTimeout:
		t := time.NewTimer(e.cfg.TimeoutHold)
		select {
		case <-c.r.Context().Done():
		case <-t.C:
		}
		t.Stop()
		release()
		e.abort(c, OutcomeTimeout)
		return reply{}
	case AnswerNormal, AnswerHTTP500Saved, AnswerDropAfterApply, AnswerCutAfterApply:
	}

	ran := false
	rp := e.idempotent(c, func() executed {
		ran = true
		if e.cfg.BeforeExecute != nil {
			e.cfg.BeforeExecute(identifier)
		}
		if latency > 0 {
			time.Sleep(latency)
		}
		if answer.Kind == AnswerHTTP500Saved {
			return executed{reply: errReply(serverError(), OutcomeServerError), save: true}
		}
		return e.applyMeterEvent(c, eventName, identifier, payload, ts, hasTS)
	})
	if !ran && latency > 0 { // a replay or an idempotency refusal takes as long
		time.Sleep(latency)
	}
	release()
	switch answer.Kind {
	case AnswerDropAfterApply:
		e.abort(c, OutcomeDropped)
		return reply{}
	case AnswerCutAfterApply:
		e.cut(c, rp)
		return reply{}
	}
	return rp
}

func serverError() *apiError {
	return &apiError{Status: http.StatusInternalServerError, Type: TypeAPIError,
		Message: "An unknown error occurred while processing your request. Please try again."}
}

// applyMeterEvent executes a meter event: dedupe, configuration checks,
// timestamp window, apply. Only an applied event is saved under the
// Idempotency-Key.
func (e *Emulator) applyMeterEvent(c *call, eventName, identifier string, payload map[string]string, ts int64, hasTS bool) executed {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.cfg.Now()
	// The identifier is taken while its latest application is younger
	// than the dedupe window.
	if e.takenLocked(now, identifier) {
		ae := invalidRequest("", "identifier", "%s %s for the event %s. Identifiers must be unique for a rolling 24 hour period.", DuplicateIdentifierMessagePrefix, identifier, eventName)
		ae.ShouldRetry = "false"
		return executed{reply: errReply(ae, OutcomeDuplicate)}
	}
	if !hasTS {
		ts = now.Unix()
	}
	ok200 := func() reply {
		return jsonReply(http.StatusOK, meterEventJSON{Object: "billing.meter_event", Created: now.Unix(),
			EventName: eventName, Identifier: identifier, Livemode: c.livemode, Payload: payload, Timestamp: ts}, OutcomeApplied)
	}
	// reject answers a configuration cause: 400 now, or, with
	// AsyncValidation, 200 now and an error report (as Stripe does).
	reject := func(code, param, format string, args ...any) executed {
		ae := invalidRequest(code, param, format, args...)
		if !e.cfg.AsyncValidation {
			return executed{reply: errReply(ae, OutcomeInvalid)}
		}
		e.reports = append(e.reports, ErrorReport{Identifier: identifier, EventName: eventName, Code: code, ReceivedAt: now})
		rp := ok200()
		rp.outcome = OutcomeErrorReported
		return executed{reply: rp, save: true}
	}
	at := time.Unix(ts, 0).UTC()
	v, ae := e.validateLocked(now, eventName, payload, at)
	if ae != nil {
		return reject(ae.Code, ae.Param, "%s", ae.Message)
	}
	e.applyLocked(now, identifier, v)

	return executed{reply: ok200(), save: true}
}

// validEvent is a meter event that passed the configuration checks.
type validEvent struct {
	meter *Meter
	cust  string   // the stored customer id
	value float64  // parsed value
	exact *big.Rat // the same value, exactly
	at    time.Time
}

// validateLocked runs the configuration checks and the timestamp window on
// one event (both APIs). The error carries Stripe's meter error report
// code. Callers hold e.mu.
func (e *Emulator) validateLocked(now time.Time, eventName string, payload map[string]string, at time.Time) (validEvent, *apiError) {
	m := e.meterForEvent(eventName)
	if m == nil {
		return validEvent{}, invalidRequest(CodeNoMeter, "event_name", "No active meter was found for event_name %s.", eventName)
	}
	if !m.Active {
		return validEvent{}, invalidRequest(CodeArchivedMeter, "event_name", "The meter for event_name %s is inactive.", eventName)
	}
	cust := payload[m.CustomerKey]
	if cust == "" {
		return validEvent{}, invalidRequest(CodeNoCustomerDefined, "payload", "The payload has no customer under the meter's customer key payload[%s].", m.CustomerKey)
	}
	if _, ok := e.customers[cust]; !ok {
		return validEvent{}, invalidRequest(CodeCustomerNotFound, "payload", "No such customer: '%s'", cust)
	}
	raw, ok := payload[m.ValueKey]
	if !ok {
		return validEvent{}, invalidRequest(CodeValueNotFound, "payload", "The payload has no value under the meter's value key payload[%s].", m.ValueKey)
	}
	value, err := strconv.ParseFloat(raw, 64)
	exact, ok := exactValue(raw)
	if !decimal.MatchString(raw) || err != nil || !ok {
		return validEvent{}, invalidRequest(CodeInvalidValue, "payload", "The value under payload[%s] must be a decimal number.", m.ValueKey)
	}
	if significantDigits(raw) > MaxValueDigits {
		return validEvent{}, invalidRequest(CodeValueTooManyDigits, "payload", "The value under payload[%s] has more than %d significant digits.", m.ValueKey, MaxValueDigits)
	}
	if at.Before(now.Add(-e.cfg.MaxPast)) {
		return validEvent{}, invalidRequest(CodeTimestampTooFarInPast, "timestamp", "Timestamp must be within the past %d days.", int(e.cfg.MaxPast/(24*time.Hour)))
	}
	if at.After(now.Add(e.cfg.MaxFuture)) {
		return validEvent{}, invalidRequest(CodeTimestampInFuture, "timestamp", "Timestamp must not be more than %s in the future.", e.cfg.MaxFuture)
	}
	return validEvent{meter: m, cust: e.customers[cust].ID, value: value, exact: exact, at: at}, nil
}

// takenLocked reports whether identifier's latest application is younger
// than the dedupe window. Callers hold e.mu.
func (e *Emulator) takenLocked(now time.Time, identifier string) bool {
	st := e.ids[identifier]
	return st.applications > 0 && now.Sub(e.events[st.last].ReceivedAt) < e.cfg.DedupeWindow
}

// applyLocked records one applied event under identifier, counting a
// second application as a duplicate (the oracle). Callers hold e.mu.
func (e *Emulator) applyLocked(now time.Time, identifier string, v validEvent) {
	st := e.ids[identifier]
	m := v.meter
	idx := len(e.events)
	e.events = append(e.events, AppliedEvent{Identifier: identifier, EventName: m.EventName, MeterID: m.ID,
		Customer: v.cust, Value: v.value, exact: v.exact, Timestamp: v.at, ReceivedAt: now})
	if e.totals[m.EventName] == nil {
		e.totals[m.EventName] = new(big.Rat)
	}
	e.totals[m.EventName].Add(e.totals[m.EventName], v.exact)
	st.applications++
	st.last = idx
	e.ids[identifier] = st
	if st.applications == 2 {
		e.duplicates = append(e.duplicates, identifier)
	}
	pk := pairKey{m.ID, v.cust}
	e.byPair[pk] = append(e.byPair[pk], idx)
}
