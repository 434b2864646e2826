package stripeemulator_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/stripeemulator"
)

// session creates a meter event session with the secret key.
func (e *env) session() (token string, expires time.Time) {
	e.t.Helper()
	rp := e.do(http.MethodPost, "/v2/billing/meter_event_session", nil, nil)
	if rp.status != 200 {
		e.t.Fatalf("session: %d %s", rp.status, rp.body)
	}
	var s struct {
		Object              string `json:"object"`
		AuthenticationToken string `json:"authentication_token"`
		ExpiresAt           string `json:"expires_at"`
	}
	if err := json.Unmarshal(rp.body, &s); err != nil {
		e.t.Fatal(err)
	}
	if s.Object != "v2.billing.meter_event_session" || s.AuthenticationToken == "" {
		e.t.Fatalf("session body %s", rp.body)
	}
	exp, err := time.Parse(time.RFC3339Nano, s.ExpiresAt)
	if err != nil {
		e.t.Fatal(err)
	}
	return s.AuthenticationToken, exp
}

// streamPost sends raw as the stream body with the token.
func (e *env) streamPost(token string, raw []byte) rawResponse {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.srv.URL+"/v2/billing/meter_event_stream", bytes.NewReader(raw))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := e.srv.Client().Do(req)
	if err != nil {
		return rawResponse{status: 0}
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil { // a cut answer: every client sees it as broken
		return rawResponse{status: 0}
	}
	return rawResponse{status: res.StatusCode, header: res.Header, body: b}
}

func streamEvents(n int, prefix, customer string, ts time.Time) []stripeemulator.StreamEvent {
	out := make([]stripeemulator.StreamEvent, n)
	for i := range out {
		out[i] = stripeemulator.StreamEvent{EventName: eventName, Identifier: fmt.Sprintf("%s-%03d", prefix, i),
			Payload: map[string]string{"stripe_customer_id": customer, "value": "2"}, Timestamp: ts.Format(time.RFC3339)}
	}
	return out
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func body(evs []stripeemulator.StreamEvent) map[string]any { return map[string]any{"events": evs} }

func TestStreamSessionAndBatch(t *testing.T) {
	e := newEnv(t, stripeemulator.Config{})
	tok, exp := e.session()
	if got := exp.Sub(epoch); got != 15*time.Minute {
		t.Fatalf("expires after %s, want 15m", got)
	}
	rp := e.streamPost(tok, mustJSON(t, body(streamEvents(100, "b1", custA, epoch))))
	if rp.status != 200 || string(rp.body) != "{}" {
		t.Fatalf("stream: %d %s", rp.status, rp.body)
	}
	if n := e.emu.AppliedCount(); n != 100 {
		t.Fatalf("applied %d, want 100", n)
	}
	// Same identifiers again: 200, not applied again, no duplicate application.
	rp = e.streamPost(tok, mustJSON(t, body(streamEvents(100, "b1", custA, epoch))))
	if rp.status != 200 || e.emu.AppliedCount() != 100 || len(e.emu.DuplicateApplications()) != 0 {
		t.Fatalf("resend: %d applied %d dup %v", rp.status, e.emu.AppliedCount(), e.emu.DuplicateApplications())
	}
	st := e.emu.Stats()
	if st.StreamDuplicates != 100 || st.Sessions != 1 || st.StreamEvents != 200 {
		t.Fatalf("stats %+v", st)
	}
	if got := len(e.emu.RequestsFor("b1-042")); got != 2 {
		t.Fatalf("RequestsFor b1-042 = %d, want 2", got)
	}
	if e.emu.AppliedTotals()[eventName] != 200 {
		t.Fatalf("totals %v", e.emu.AppliedTotals())
	}
}

func TestStreamSynchronousErrors(t *testing.T) {
	ts := epoch.Format(time.RFC3339)
	ok := stripeemulator.StreamEvent{EventName: eventName, Identifier: "x", Payload: map[string]string{"stripe_customer_id": custA, "value": "1"}, Timestamp: ts}
	cases := []struct {
		name   string
		token  string // "" = a fresh session; "none" = no header; else literal
		raw    []byte
		status int
		code   string
	}{
		{"no token", "none", mustJSON(t, body([]stripeemulator.StreamEvent{ok})), 401, ""},
		{"secret key as token", testKey, mustJSON(t, body([]stripeemulator.StreamEvent{ok})), 401, ""},
		{"not json", "", []byte("events=1"), 400, stripeemulator.CodeParameterInvalid},
		{"no events", "", []byte(`{"events":[]}`), 400, stripeemulator.CodeParameterMissing},
		{"101 events", "", mustJSON(t, body(streamEvents(101, "big", custA, epoch))), 400, stripeemulator.CodeParameterInvalid},
		{"numeric payload value", "", []byte(`{"events":[{"event_name":"api_calls","identifier":"n","payload":{"stripe_customer_id":"cus_A","value":1},"timestamp":"` + ts + `"}]}`), 400, stripeemulator.CodeParameterInvalid},
		{"unix timestamp", "", []byte(`{"events":[{"event_name":"api_calls","identifier":"u","payload":{"stripe_customer_id":"cus_A","value":"1"},"timestamp":"1700000000"}]}`), 400, stripeemulator.CodeParameterInvalid},
		{"no event_name", "", []byte(`{"events":[{"identifier":"e","payload":{"value":"1"}}]}`), 400, stripeemulator.CodeParameterMissing},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, stripeemulator.Config{})
			tok := tc.token
			switch tok {
			case "":
				tok, _ = e.session()
			case "none":
				tok = ""
			}
			rp := e.streamPost(tok, tc.raw)
			if rp.status != tc.status {
				t.Fatalf("status %d %s, want %d", rp.status, rp.body, tc.status)
			}
			if tc.code != "" {
				if got := rp.errorObject(t)["code"]; got != tc.code {
					t.Fatalf("code %v, want %s", got, tc.code)
				}
			}
			if e.emu.AppliedCount() != 0 {
				t.Fatal("applied on a refused request")
			}
		})
	}
}

func TestStreamSessionExpiresOnEmulatorClock(t *testing.T) {
	for _, status := range []int{401, 400} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			e := newEnv(t, stripeemulator.Config{SessionExpiredStatus: status})
			tok, _ := e.session()
			e.clock.Advance(15*time.Minute - time.Second)
			if rp := e.streamPost(tok, mustJSON(t, body(streamEvents(1, "a", custA, e.clock.Now())))); rp.status != 200 {
				t.Fatalf("before expiry: %d %s", rp.status, rp.body)
			}
			e.clock.Advance(time.Second)
			rp := e.streamPost(tok, mustJSON(t, body(streamEvents(1, "b", custA, e.clock.Now()))))
			eo := rp.errorObject(t)
			if rp.status != status || eo["code"] != stripeemulator.CodeSessionExpired || eo["type"] != stripeemulator.TypeSessionExpired {
				t.Fatalf("expired: %d %s", rp.status, rp.body)
			}
			tok2, _ := e.session()
			if rp := e.streamPost(tok2, mustJSON(t, body(streamEvents(1, "b", custA, e.clock.Now())))); rp.status != 200 {
				t.Fatalf("new session: %d %s", rp.status, rp.body)
			}
			if e.emu.AppliedCount() != 2 {
				t.Fatalf("applied %d", e.emu.AppliedCount())
			}
		})
	}
}

// Configuration causes are asynchronous on the stream: the request is 200,
// the bad event is not applied and becomes an error report, the others apply.
func TestStreamAsyncRejections(t *testing.T) {
	e := newEnv(t, stripeemulator.Config{})
	tok, _ := e.session()
	evs := streamEvents(100, "r", custA, epoch)
	evs[37].Payload = map[string]string{"stripe_customer_id": "cus_gone", "value": "2"}
	evs[50].Timestamp = epoch.Add(-36 * 24 * time.Hour).Format(time.RFC3339)
	evs[60].Timestamp = epoch.Add(6 * time.Minute).Format(time.RFC3339)
	evs[70].EventName = "no_such_meter"
	evs[80].Payload = map[string]string{"stripe_customer_id": custA, "value": "x"}
	rp := e.streamPost(tok, mustJSON(t, body(evs)))
	if rp.status != 200 {
		t.Fatalf("%d %s", rp.status, rp.body)
	}
	if n := e.emu.AppliedCount(); n != 95 {
		t.Fatalf("applied %d, want 95", n)
	}
	want := map[string]string{"r-037": stripeemulator.CodeCustomerNotFound, "r-050": stripeemulator.CodeTimestampTooFarInPast,
		"r-060": stripeemulator.CodeTimestampInFuture, "r-070": stripeemulator.CodeNoMeter, "r-080": stripeemulator.CodeInvalidValue}
	reps := e.emu.ErrorReports()
	if len(reps) != len(want) {
		t.Fatalf("reports %+v", reps)
	}
	for _, r := range reps {
		if want[r.Identifier] != r.Code {
			t.Fatalf("report %+v, want %v", r, want)
		}
	}
}

// Faults per request: 429/500/drop/timeout apply nothing; drop- and
// cut-after-apply apply every event and break the connection, and the
// resend applies nothing again.
func TestStreamFaults(t *testing.T) {
	cases := []struct {
		answer  string
		status  int
		applied int
	}{
		{"429", 429, 0}, {"500", 500, 0}, {"500-saved", 500, 0}, {"400:parameter_invalid_string", 400, 0},
		{"session-expired", 401, 0}, {"drop", 0, 0}, {"timeout", 0, 0},
		{"drop-after-apply", 0, 10}, {"cut-after-apply", 0, 10}, {"ok", 200, 10},
	}
	for _, tc := range cases {
		t.Run(tc.answer, func(t *testing.T) {
			e := newEnv(t, stripeemulator.Config{TimeoutHold: 50 * time.Millisecond})
			tok, _ := e.session()
			a, err := stripeemulator.ParseAnswers(tc.answer)
			if err != nil {
				t.Fatal(err)
			}
			e.emu.Script("f-003", a...) // any event of the batch carries the batch's answer
			evs := streamEvents(10, "f", custA, epoch)
			rp := e.streamPost(tok, mustJSON(t, body(evs)))
			if rp.status != tc.status {
				t.Fatalf("status %d %s, want %d", rp.status, rp.body, tc.status)
			}
			if got := e.emu.AppliedCount(); got != tc.applied {
				t.Fatalf("applied %d, want %d", got, tc.applied)
			}
			if rp := e.streamPost(tok, mustJSON(t, body(evs))); rp.status != 200 {
				t.Fatalf("resend %d", rp.status)
			}
			if e.emu.AppliedCount() != 10 || len(e.emu.DuplicateApplications()) != 0 {
				t.Fatalf("after resend applied %d dup %v", e.emu.AppliedCount(), e.emu.DuplicateApplications())
			}
		})
	}
}

// A stream event and a v1 meter event with the same identifier are one
// event: moving an item between exporters never bills it twice.
func TestStreamSharesDedupeWithV1(t *testing.T) {
	e := newEnv(t, stripeemulator.Config{})
	if _, err := e.sc.BillingMeterEvents.New(event("same-1", custA, "2", epoch)); err != nil {
		t.Fatal(err)
	}
	tok, _ := e.session()
	evs := streamEvents(1, "x", custA, epoch)
	evs[0].Identifier = "same-1"
	if rp := e.streamPost(tok, mustJSON(t, body(evs))); rp.status != 200 {
		t.Fatalf("%d", rp.status)
	}
	if e.emu.AppliedCount() != 1 || e.emu.Applications("same-1") != 1 {
		t.Fatalf("applied %d", e.emu.AppliedCount())
	}
	// After the dedupe window a resend applies again: the oracle counts it.
	e.clock.Advance(24*time.Hour + time.Second)
	tok, _ = e.session()
	evs[0].Timestamp = e.clock.Now().Format(time.RFC3339)
	if rp := e.streamPost(tok, mustJSON(t, body(evs))); rp.status != 200 {
		t.Fatalf("%d", rp.status)
	}
	if got := e.emu.DuplicateApplications(); len(got) != 1 || got[0] != "same-1" {
		t.Fatalf("duplicates %v", got)
	}
}
