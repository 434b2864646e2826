package streamexport

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/deliverer"
	"github.com/aurora-billing/aurora/deliverer/stripeexport"
)

// fuzzStripe answers the two v2 endpoints without a network: the session
// endpoint with session(), the stream with stream(), and keeps what the
// stream requests carried.
type fuzzStripe struct {
	session, stream func() *http.Response

	mu       sync.Mutex
	sessions int               // session requests
	sent     [][]Event         // events of every stream request, in order
	bodies   map[string]string // identifier → the event's JSON the first time it was sent
	auth     []string          // Authorization of every stream request
}

func (f *fuzzStripe) RoundTrip(req *http.Request) (*http.Response, error) {
	var raw []byte
	if req.Body != nil {
		raw, _ = io.ReadAll(req.Body)
		_ = req.Body.Close()
	}
	var r *http.Response
	f.mu.Lock()
	switch req.URL.Path {
	case "/v2/billing/meter_event_session":
		f.sessions++
		r = f.session()
	case "/v2/billing/meter_event_stream":
		var b struct{ Events []json.RawMessage }
		_ = json.Unmarshal(raw, &b)
		evs := make([]Event, len(b.Events))
		for i, e := range b.Events {
			_ = json.Unmarshal(e, &evs[i])
			if _, ok := f.bodies[evs[i].Identifier]; !ok {
				f.bodies[evs[i].Identifier] = string(e)
			} else if f.bodies[evs[i].Identifier] != string(e) {
				f.bodies[evs[i].Identifier] = "changed" // never the JSON of an event
			}
		}
		f.sent = append(f.sent, evs)
		f.auth = append(f.auth, req.Header.Get("Authorization"))
		r = f.stream()
	default:
		r = fuzzResponse(404, "", "", nil)
	}
	f.mu.Unlock()
	r.Request = req
	return r, nil
}

func (f *fuzzStripe) reset() {
	f.mu.Lock()
	f.sessions, f.sent, f.bodies, f.auth = 0, nil, map[string]string{}, nil
	f.mu.Unlock()
}

// fuzzResponse is one HTTP answer; a new one per call (the body is read
// once).
func fuzzResponse(status int, requestID, contentType string, body []byte) *http.Response {
	h := http.Header{}
	if requestID != "" {
		h.Set("Request-Id", requestID)
	}
	if contentType != "" {
		h.Set("Content-Type", contentType)
	}
	return &http.Response{StatusCode: status, Status: http.StatusText(status), Header: h, ProtoMajor: 1, ProtoMinor: 1,
		Body: io.NopCloser(bytes.NewReader(body)), ContentLength: int64(len(body))}
}

const fuzzKey = "sk_test_fuzz_stream"

// FuzzStreamAnswer: any answer of the v2 meter event stream (status,
// Request-Id and Content-Type headers, body), or of the session endpoint
// before it (session = true; the stream then answers 200 {}), goes through
// the client's reading (Client.do), the stream table (Rules: accept, new
// session, split, per item) and the v1 table it defers to, for a batch of
// three events (go test -fuzz '^FuzzStreamAnswer$' ./deliverer/streamexport).
// The stream's synchronous answer names no event (Stripe validates each
// event asynchronously and reports it later), so an error can only reach
// one event by splitting; the seeds are Stripe's documented answer shapes
// (`{}`, its error object), written here: the shared data folder has no
// stream answers. Regressions in testdata/fuzz/FuzzStreamAnswer/.
//
// Invariants: every event of the batch gets exactly one result, with a
// rule of the stream table ("stream_<rule>", or "stream_<rule>/<v1 rule>"
// when the v1 table decided, and then that v1 row's outcome and reason) and
// one of the five outcomes; a reason is set exactly for a quarantine; the
// status and Request-Id are the answer's; a 2xx is accepted for every event
// with ProviderRef the Request-Id or the identifier; a 5xx, 409 or 429
// is retried; a 1xx, 3xx or ≥ 600 is uncertain; a 4xx that is not a
// session or token answer is decided per event by the v1 table, each event
// alone in its last request (never a whole batch for one event); every
// resend carries the same identifiers with byte-identical events, and only
// the batch's; the API key is never sent to the stream (only the session
// token). On the session side: a failed session sends nothing, a 401/403
// goes to the v1 table (session_refused), any other failure is a retry.
func FuzzStreamAnswer(f *testing.F) {
	for _, s := range []struct {
		status  int
		body    string
		session bool
	}{
		{200, `{}`, false},
		{202, ``, false},
		{400, `{"error":{"type":"invalid_request_error","code":"parameter_invalid_string","message":"Invalid string","param":"events[1].identifier"}}`, false},
		{400, `{"error":{"type":"invalid_request_error","message":"An event already exists with identifier 1234"}}`, false},
		{400, `{"error":{"type":"temporary_session_expired","code":"billing_meter_event_session_expired"}}`, false},
		{401, `{"error":{"type":"temporary_session_expired","code":"billing_meter_event_session_expired"}}`, false},
		{401, `{"error":{"type":"invalid_request_error","message":"Invalid token"}}`, false},
		{403, `{"error":{"type":"invalid_request_error"}}`, false},
		{404, `{"error":{"type":"invalid_request_error","code":"no_meter"}}`, false},
		{413, `{"error":{"type":"invalid_request_error"}}`, false},
		{429, `{"error":{"type":"invalid_request_error","code":"rate_limit"}}`, false},
		{409, `{"error":{"code":"idempotency_key_in_use"}}`, false},
		{500, `<html>oops</html>`, false},
		{302, `{"id":"x"}`, false},
		{400, "{\"error\":{\"code\":\"\\u0000\",\"message\":\"bad \\u0000 \\ud800\"}}", false},
		{200, `{"object":"v2.billing.meter_event_session","authentication_token":"ek_test_x","created":"2026-01-01T00:00:00Z","expires_at":"2026-01-01T00:15:00Z"}`, true},
		{200, `{"authentication_token":"","created":"2026-01-01T00:00:00Z","expires_at":"2026-01-01T00:15:00Z"}`, true},
		{401, `{"error":{"type":"invalid_request_error","message":"Invalid API Key provided"}}`, true},
		{500, ``, true},
	} {
		f.Add(s.status, "req_123", "application/json", []byte(s.body), s.session)
	}
	f.Add(200, "req_\x00\xff", "text/html", []byte("{}"), false)

	var cur func() *http.Response
	okSession := func() *http.Response {
		return fuzzResponse(200, "req_session", "application/json",
			[]byte(`{"object":"v2.billing.meter_event_session","authentication_token":"ek_test_fuzz","created":"2026-01-01T00:00:00Z","expires_at":"2026-01-01T00:15:00Z"}`))
	}
	okStream := func() *http.Response { return fuzzResponse(200, "req_ok", "application/json", []byte(`{}`)) }
	fake := &fuzzStripe{}
	// The clock moves an hour on every reading, so every request asks for
	// a session first: the session answer is fuzzed on every input.
	var clock atomic.Int64
	now := func() time.Time { return time.Unix(1_800_000_000+clock.Add(3600), 0) }
	x, err := New(Config{Client: ClientConfig{APIKey: fuzzKey, APIBase: "http://stripe.invalid", Timeout: 5 * time.Second, Now: now},
		Senders: 1, MaxBatch: 3})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(x.Close)
	x.c.http.Transport = fake

	rs := make([]deliverer.Request, 3)
	keys := make([]string, len(rs))
	for i := range rs {
		rs[i] = deliverer.Request{ItemID: int64(i + 1), Account: "acct_fuzz", Via: deliverer.ExporterStream,
			Key: fmt.Sprintf("%064d", i+1), EventName: "api_calls", CustomerKey: "stripe_customer_id", ValueKey: "value",
			Customer: "cus_4QWKsZuuTHcs7X", Value: int64(i * 25), Timestamp: time.Unix(1_234_567_890, 0)}
		keys[i] = rs[i].Key
	}
	streamNames := map[string]bool{"session_refused": true, "session_failed": true}
	for _, r := range Rules() {
		streamNames[r.Name] = true
	}
	v1 := map[string]stripeexport.Rule{}
	for _, r := range stripeexport.Rules() {
		v1[r.Name] = r
	}
	outcomes := []deliverer.Outcome{deliverer.OutcomeAccepted, deliverer.OutcomeRetry, deliverer.OutcomeUncertain,
		deliverer.OutcomeRejected, deliverer.OutcomeQuarantined}

	f.Fuzz(func(t *testing.T, status int, requestID, contentType string, body []byte, session bool) {
		status = 100 + (status%900+900)%900
		cur = func() *http.Response { return fuzzResponse(status, requestID, contentType, body) }
		fake.session, fake.stream = okSession, cur
		if session {
			fake.session, fake.stream = cur, okStream
		}
		fake.reset()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		results := x.ExportGroup(ctx, rs)

		if len(results) != len(rs) {
			t.Fatalf("%d results for %d events", len(results), len(rs))
		}
		for i, res := range results {
			name, v1name, perItem := strings.Cut(strings.TrimPrefix(res.Rule, "stream_"), "/")
			if !strings.HasPrefix(res.Rule, "stream_") || !streamNames[name] || !slices.Contains(outcomes, res.Outcome) {
				t.Fatalf("event %d unclassified: %+v", i, res)
			}
			if (res.Reason != "") != (res.Outcome == deliverer.OutcomeQuarantined) {
				t.Fatalf("event %d: reason %q with outcome %s", i, res.Reason, res.Outcome)
			}
			if perItem {
				r, ok := v1[v1name]
				if !ok || r.Outcome != res.Outcome || r.Reason != res.Reason {
					t.Fatalf("event %d: %+v is not what v1 rule %q says", i, res, v1name)
				}
			}
			if res.Outcome == deliverer.OutcomeAccepted && res.ProviderRef != rs[i].Key && (res.ProviderRef == "" || res.ProviderRef != res.RequestID) {
				t.Fatalf("event %d: provider ref %q (request id %q)", i, res.ProviderRef, res.RequestID)
			}
		}

		fake.mu.Lock()
		sent, bodies, auth, sessions := fake.sent, fake.bodies, fake.auth, fake.sessions
		fake.mu.Unlock()
		for _, a := range auth {
			if strings.Contains(a, fuzzKey) || a != "Bearer ek_test_fuzz" && !session {
				t.Fatalf("stream request authorized with %q", a)
			}
		}
		for id, b := range bodies {
			if !slices.Contains(keys, id) || b == "changed" {
				t.Fatalf("identifier %q: sent %s", id, b)
			}
		}
		if sessions == 0 {
			t.Fatal("no session was asked for")
		}

		if session {
			sessionOK := len(sent) > 0
			for i, res := range results {
				switch {
				case sessionOK:
					if status != 200 || res.Outcome != deliverer.OutcomeAccepted || res.RequestID != "req_ok" {
						t.Fatalf("session %d, then event %d: %+v", status, i, res)
					}
				case status == 401 || status == 403:
					if !strings.HasPrefix(res.Rule, "stream_session_refused/") || res.HTTPStatus != status || res.RequestID != requestID {
						t.Fatalf("session %d, event %d: %+v", status, i, res)
					}
				default:
					if res.Rule != "stream_session_failed" || res.Outcome != deliverer.OutcomeRetry {
						t.Fatalf("session %d, event %d: %+v", status, i, res)
					}
					if status == 200 && res.HTTPStatus != 0 || status != 200 && (res.HTTPStatus != status || res.RequestID != requestID) {
						t.Fatalf("session %d, event %d: %+v", status, i, res)
					}
				}
			}
			return
		}

		if len(sent) == 0 {
			t.Fatal("nothing was sent")
		}
		for i, res := range results {
			if res.HTTPStatus != status || res.RequestID != requestID {
				t.Fatalf("status %d, request id %q recorded as %d, %q", status, requestID, res.HTTPStatus, res.RequestID)
			}
			switch {
			case status >= 200 && status < 300:
				if res.Outcome != deliverer.OutcomeAccepted {
					t.Fatalf("%d: event %d %s (%s)", status, i, res.Outcome, res.Rule)
				}
			case status >= 500 && status < 600, status == 409, status == 429:
				if res.Outcome != deliverer.OutcomeRetry {
					t.Fatalf("%d: event %d %s (%s)", status, i, res.Outcome, res.Rule)
				}
			case status < 200, status >= 300 && status < 400, status >= 600:
				if res.Outcome != deliverer.OutcomeUncertain {
					t.Fatalf("%d: event %d %s (%s)", status, i, res.Outcome, res.Rule)
				}
			case res.Rule == "stream_session_expired":
				// 400/401 billing_meter_event_session_expired, still after
				// two new sessions: retried, never quarantined.
				if res.Outcome != deliverer.OutcomeRetry {
					t.Fatalf("%d: event %d %s (%s)", status, i, res.Outcome, res.Rule)
				}
			case status == 401, status == 403, status == 404:
				if !strings.Contains(res.Rule, "/") {
					t.Fatalf("%d: event %d not decided by the v1 table (%s)", status, i, res.Rule)
				}
			default: // any other 4xx: split down to the event alone
				if !strings.HasPrefix(res.Rule, "stream_request_invalid/") {
					t.Fatalf("%d: event %d %s (%s)", status, i, res.Outcome, res.Rule)
				}
				alone := false
				for _, evs := range sent {
					alone = alone || len(evs) == 1 && evs[0].Identifier == rs[i].Key
				}
				if !alone {
					t.Fatalf("%d: event %d decided without being sent alone (%d requests)", status, i, len(sent))
				}
			}
		}
	})
}
