package stripeemulator

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// The v2 meter event stream, as Stripe's API reference describes it:
//
//   - POST /v2/billing/meter_event_session, authenticated with the secret
//     key, no body, answers {id, object, authentication_token, created,
//     expires_at, livemode}; the token is valid SessionTTL (15 minutes) on
//     the emulator's clock.
//   - POST /v2/billing/meter_event_stream, `Authorization: Bearer <token>`,
//     JSON body {"events":[{event_name, payload, identifier, timestamp}]}
//     with 1..MaxStreamEvents events, payload values strings, timestamp RFC
//     3339; answers 200 {}. An expired token is
//     billing_meter_event_session_expired (Config.SessionExpiredStatus, 401
//     as in Stripe's spec; 400 as in some SDK tests).
//
// Validation of the events themselves is asynchronous, as at Stripe: an
// event with a configuration cause (no_meter, unknown customer, bad value,
// timestamp outside the window) is answered within the 200 and recorded as
// an ErrorReport; an identifier seen within the dedupe window is silently
// not applied again (Stripe documents no error for it). Only a malformed
// request (not JSON, no events, more than MaxStreamEvents, a field of the
// wrong type) is a synchronous 400, for the whole request.
//
// Faults apply per request, drawn from the first event's identifier and its
// attempt count: 429 and 500 process nothing; drop-after-apply and
// cut-after-apply apply every event and then break the connection; timeout
// holds the request unprocessed. There is no idempotency layer: the
// identifiers are the dedupe.

// MaxStreamEvents is the stream's "up to 100 events per request".
const MaxStreamEvents = 100

// SessionTTLDefault: the session token is valid 15 minutes.
const SessionTTLDefault = 15 * time.Minute

// Session-expired answer of the stream (Stripe's OpenAPI spec).
const (
	CodeSessionExpired = "billing_meter_event_session_expired"
	TypeSessionExpired = "temporary_session_expired"
)

// Routes of the v2 endpoints.
const (
	RouteMeterEventSession Route = "POST /v2/billing/meter_event_session"
	RouteMeterEventStream  Route = "POST /v2/billing/meter_event_stream"
)

// maxStreamBodyBytes caps a stream request body (100 events of at most a
// few KiB each).
const maxStreamBodyBytes = 1 << 20

// session is one meter event session.
type session struct {
	apiKey   string
	livemode bool
	expires  time.Time
}

type sessionJSON struct {
	ID                  string `json:"id"`
	Object              string `json:"object"`
	AuthenticationToken string `json:"authentication_token"`
	Created             string `json:"created"`
	ExpiresAt           string `json:"expires_at"`
	Livemode            bool   `json:"livemode"`
}

// StreamEvent is one event of a stream request, as sent on the wire.
type StreamEvent struct {
	EventName  string            `json:"event_name"`
	Identifier string            `json:"identifier,omitempty"`
	Payload    map[string]string `json:"payload"`
	Timestamp  string            `json:"timestamp,omitempty"`
}

type streamBody struct {
	Events []StreamEvent `json:"events"`
}

func (e *Emulator) registerStream(mux *http.ServeMux) {
	mux.HandleFunc("POST /v2/billing/meter_event_session", e.authed(RouteMeterEventSession, e.handleSessionCreate))
	mux.HandleFunc("POST /v2/billing/meter_event_stream", e.handleStream)
}

// handleSessionCreate is POST /v2/billing/meter_event_session.
func (e *Emulator) handleSessionCreate(c *call) reply {
	e.mu.Lock()
	now := e.cfg.Now()
	id := e.newID("mes_", 24)
	tok := e.newID("ek_test_", 32)
	if c.livemode {
		tok = "ek_live_" + tok[len("ek_test_"):]
	}
	exp := now.Add(e.cfg.SessionTTL)
	e.sessions[tok] = session{apiKey: c.apiKey, livemode: c.livemode, expires: exp}
	e.sessionsN++
	// Forget sessions expired for a while (bounded memory).
	if len(e.sessions) > 1024 {
		for k, s := range e.sessions {
			if now.Sub(s.expires) > time.Hour {
				delete(e.sessions, k)
			}
		}
	}
	e.mu.Unlock()
	return jsonReply(http.StatusOK, sessionJSON{ID: id, Object: "v2.billing.meter_event_session", AuthenticationToken: tok,
		Created: now.UTC().Format(time.RFC3339Nano), ExpiresAt: exp.UTC().Format(time.RFC3339Nano), Livemode: c.livemode}, OutcomeOK)
}

// Sessions returns how many meter event sessions were created.
func (e *Emulator) Sessions() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.sessionsN
}

// ExpireSessions makes every session token expired now (as if the clock
// had passed their expires_at).
func (e *Emulator) ExpireSessions() {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.cfg.Now()
	for k, s := range e.sessions {
		s.expires = now
		e.sessions[k] = s
	}
}

// handleStream is POST /v2/billing/meter_event_stream. Order: token, body,
// faults, then each event (dedupe, validation, apply).
func (e *Emulator) handleStream(w http.ResponseWriter, r *http.Request) {
	c := &call{w: w, r: r, route: RouteMeterEventStream}
	e.mu.Lock()
	c.requestID = e.newID("req_", 14)
	c.received = e.cfg.Now()
	e.mu.Unlock()
	c.idemKey = strings.TrimSpace(r.Header.Get("Idempotency-Key"))
	rp := e.stream(c)
	if !c.done {
		e.finish(c, rp)
	}
}

func (e *Emulator) stream(c *call) reply {
	buf, err := io.ReadAll(http.MaxBytesReader(c.w, c.r.Body, maxStreamBodyBytes))
	if err != nil {
		return errReply(invalidRequest("", "", "Could not read the request body (at most %d bytes of JSON).", maxStreamBodyBytes), OutcomeInvalid)
	}
	c.bodySum = sha256.Sum256(buf)
	// The request log names the identifiers of every request, refused
	// ones included (a resend after an expired session is visible).
	var peek streamBody
	if json.Unmarshal(buf, &peek) == nil && len(peek.Events) > 0 && len(peek.Events) <= MaxStreamEvents {
		for _, ev := range peek.Events {
			c.identifiers = append(c.identifiers, strings.Clone(ev.Identifier))
		}
		c.identifier = c.identifiers[0]
	}
	tok, _ := strings.CutPrefix(c.r.Header.Get("Authorization"), "Bearer ")
	tok = strings.TrimSpace(tok)
	e.mu.Lock()
	s, ok := e.sessions[tok]
	now := e.cfg.Now()
	e.mu.Unlock()
	if tok == "" || !ok {
		return errReply(&apiError{Status: http.StatusUnauthorized, Type: TypeInvalidRequestError,
			Message: "Invalid or missing meter event session token: create one with POST /v2/billing/meter_event_session."}, OutcomeUnauthorized)
	}
	if !now.Before(s.expires) {
		return e.sessionExpired()
	}
	c.apiKey, c.livemode = s.apiKey, s.livemode

	var body streamBody
	dec := json.NewDecoder(bytes.NewReader(buf))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		return errReply(invalidRequest(CodeParameterInvalid, "", "Invalid JSON body: %s", jsonProblem(err)), OutcomeInvalid)
	}
	if len(body.Events) == 0 {
		return errReply(invalidRequest(CodeParameterMissing, "events", "Missing required param: events."), OutcomeInvalid)
	}
	if len(body.Events) > MaxStreamEvents {
		return errReply(invalidRequest(CodeParameterInvalid, "events", "At most %d events per request; got %d.", MaxStreamEvents, len(body.Events)), OutcomeInvalid)
	}
	ats := make([]time.Time, len(body.Events))
	for i, ev := range body.Events {
		if ae := checkStreamEvent(i, ev); ae != nil {
			return errReply(ae, OutcomeInvalid)
		}
		if ev.Timestamp != "" {
			ats[i], _ = time.Parse(time.RFC3339Nano, ev.Timestamp) // checked above
		}
	}

	e.mu.Lock()
	ids := make([]string, len(body.Events))
	for i := range body.Events {
		ev := &body.Events[i]
		ev.Identifier = strings.Clone(ev.Identifier)
		if ev.Identifier == "" {
			ev.Identifier = e.newID("mevt_", 24)
		}
		ids[i] = ev.Identifier
	}
	c.identifier, c.identifiers = ids[0], ids
	st := e.ids[ids[0]]
	n := st.attempts
	for _, id := range ids {
		st := e.ids[id]
		st.attempts++
		e.ids[id] = st
	}
	var answer Answer
	scripted := false
	for _, id := range ids {
		if q := e.scripts[id]; len(q) > 0 {
			answer, scripted = q[0], true
			if len(q) == 1 {
				delete(e.scripts, id)
			} else {
				e.scripts[id] = q[1:]
			}
			break
		}
	}
	if !scripted {
		answer = e.faults.decide(e.cfg.Seed, ids[0], n)
	}
	latency := e.faults.latency(e.cfg.Seed, ids[0], n)
	e.mu.Unlock()
	if latency > 0 {
		time.Sleep(latency)
	}

	switch answer.Kind {
	case AnswerHTTP429:
		return errReply(&apiError{Status: http.StatusTooManyRequests, Type: TypeInvalidRequestError, Code: CodeRateLimit,
			Message: "Request rate limit exceeded. Learn more about rate limits here https://stripe.com/docs/rate-limits."}, OutcomeRateLimited)
	case AnswerHTTP500, AnswerHTTP500Saved:
		return errReply(serverError(), OutcomeServerError)
	case AnswerHTTP409:
		return errReply(&apiError{Status: http.StatusConflict, Type: TypeInvalidRequestError, Code: CodeIdempotencyKeyInUse,
			Message: "There is currently another in-progress request using this idempotent key. Please try again later."}, OutcomeKeyInUse)
	case AnswerHTTP400:
		return errReply(invalidRequest(answer.Code, "", "Injected error (%s).", answer.Code), OutcomeInvalid)
	case AnswerHTTP401:
		return errReply(&apiError{Status: http.StatusUnauthorized, Type: TypeInvalidRequestError, Message: "Invalid meter event session token."}, OutcomeUnauthorized)
	case AnswerHTTP403:
		return errReply(&apiError{Status: http.StatusForbidden, Type: TypeInvalidRequestError, Message: "The session's key does not have the required permissions for this endpoint."}, OutcomeForbidden)
	case AnswerSessionExpired:
		return e.sessionExpired()
	case AnswerDrop:
		e.abort(c, OutcomeDropped)
		return reply{}
	case AnswerTimeout:
		t := time.NewTimer(e.cfg.TimeoutHold)
		select {
		case <-c.r.Context().Done():
		case <-t.C:
		}
		t.Stop()
		e.abort(c, OutcomeTimeout)
		return reply{}
	case AnswerNormal, AnswerDropAfterApply, AnswerCutAfterApply:
	}

	if e.cfg.BeforeExecute != nil {
		for _, id := range ids {
			e.cfg.BeforeExecute(id)
		}
	}
	e.mu.Lock()
	now = e.cfg.Now()
	for i, ev := range body.Events {
		if e.takenLocked(now, ev.Identifier) {
			e.streamDupes++
			continue
		}
		at := ats[i]
		if ev.Timestamp == "" {
			at = now
		}
		v, ae := e.validateLocked(now, ev.EventName, ev.Payload, at.Truncate(time.Second).UTC())
		if ae != nil {
			e.reports = append(e.reports, ErrorReport{Identifier: ev.Identifier, EventName: ev.EventName, Code: ae.Code, ReceivedAt: now})
			continue
		}
		e.applyLocked(now, ev.Identifier, v)
	}
	e.streamEvents += len(body.Events)
	e.mu.Unlock()
	rp := reply{status: http.StatusOK, body: []byte("{}"), outcome: OutcomeApplied}
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

func (e *Emulator) sessionExpired() reply {
	return errReply(&apiError{Status: e.cfg.SessionExpiredStatus, Type: TypeSessionExpired, Code: CodeSessionExpired,
		Message: "The meter event session has expired: create a new session."}, OutcomeUnauthorized)
}

// checkStreamEvent checks one event's shape (synchronous: a malformed
// request is refused whole).
func checkStreamEvent(i int, ev StreamEvent) *apiError {
	param := func(f string) string { return fmt.Sprintf("events[%d].%s", i, f) }
	switch {
	case ev.EventName == "":
		return invalidRequest(CodeParameterMissing, param("event_name"), "Missing required param: %s.", param("event_name"))
	case len(ev.Payload) == 0:
		return invalidRequest(CodeParameterMissing, param("payload"), "Missing required param: %s.", param("payload"))
	case len(ev.Identifier) > MaxIdentifierLength:
		return invalidRequest(CodeParameterInvalid, param("identifier"), "Invalid identifier: must be at most %d characters", MaxIdentifierLength)
	}
	if ev.Timestamp != "" {
		if _, err := time.Parse(time.RFC3339Nano, ev.Timestamp); err != nil {
			return invalidRequest(CodeParameterInvalid, param("timestamp"), "Invalid timestamp: must be an RFC 3339 date-time string.")
		}
	}
	return nil
}

// jsonProblem names what is wrong with a body without echoing its values.
func jsonProblem(err error) string {
	var te *json.UnmarshalTypeError
	if ok := asType(err, &te); ok {
		return fmt.Sprintf("field %s must be a %s", te.Field, te.Type.String())
	}
	if strings.HasPrefix(err.Error(), "json: unknown field") {
		return err.Error()
	}
	return "not a JSON object"
}

func asType(err error, te **json.UnmarshalTypeError) bool {
	t, ok := err.(*json.UnmarshalTypeError)
	if ok {
		*te = t
	}
	return ok
}
