package stripeexport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/deliverer"
	"github.com/aurora-billing/aurora/shared/config"
	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/outbox"
)

func stripeErr(status int, typ, code, param, msg string) func(w http.ResponseWriter, r *http.Request) {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Request-Id", "req_canned")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"error":{"type":%q,"code":%q,"param":%q,"message":%q}}`, typ, code, param, msg)
	}
}

var testReq = deliverer.Request{
	ItemID: 1, Key: strings.Repeat("ab", 32), EventName: "api_calls", CustomerKey: "stripe_customer_id", ValueKey: "value",
	Customer: "cus_TEST", Value: 5, Timestamp: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC),
}

// TestClassificationTable answers every row of Rules from a canned
// httptest server through the real stripe-go client and checks the row that
// matched and the outcome. Every rule must be exercised.
func TestClassificationTable(t *testing.T) {
	t.Parallel()
	type tc struct {
		rule    string
		handler func(w http.ResponseWriter, r *http.Request)
		timeout bool // the handler blocks past the client's deadline
		refused bool // nothing listens
		outcome deliverer.Outcome
		reason  outbox.Reason
	}
	ok := func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Request-Id", "req_ok")
		fmt.Fprintf(w, `{"object":"billing.meter_event","identifier":%q,"event_name":"api_calls","livemode":false,"payload":{},"timestamp":1}`, testReq.Key)
	}
	drop := func(w http.ResponseWriter, _ *http.Request) {
		hj := w.(http.Hijacker)
		c, _, _ := hj.Hijack()
		c.Close()
	}
	cases := []tc{
		{rule: "timeout", timeout: true, outcome: deliverer.OutcomeRetry},
		{rule: "connection_error", handler: drop, outcome: deliverer.OutcomeRetry},
		{rule: "connection_error", refused: true, outcome: deliverer.OutcomeRetry},
		{rule: "http_2xx", handler: ok, outcome: deliverer.OutcomeAccepted},
		{rule: "duplicate_identifier", handler: stripeErr(400, "invalid_request_error", "", "identifier", "An event already exists with identifier "+testReq.Key+"."), outcome: deliverer.OutcomeAccepted},
		{rule: "idempotency_error", handler: stripeErr(400, "idempotency_error", "", "", "Keys for idempotent requests can only be used with the same parameters they were first used with."), outcome: deliverer.OutcomeUncertain},
		{rule: "idempotency_key_in_use", handler: stripeErr(409, "invalid_request_error", "idempotency_key_in_use", "", "in use"), outcome: deliverer.OutcomeRetry},
		{rule: "rate_limited", handler: stripeErr(429, "invalid_request_error", "rate_limit", "", "Too many requests"), outcome: deliverer.OutcomeRetry},
		{rule: "server_error", handler: stripeErr(500, "api_error", "", "", "boom"), outcome: deliverer.OutcomeRetry},
		{rule: "server_error", handler: func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(502)
			io.WriteString(w, "<html>bad gateway</html>")
		}, outcome: deliverer.OutcomeRetry},
		{rule: "server_error", handler: stripeErr(503, "api_error", "", "", "unavailable"), outcome: deliverer.OutcomeRetry},
		{rule: "unauthorized", handler: stripeErr(401, "invalid_request_error", "", "", "Invalid API Key provided"), outcome: deliverer.OutcomeQuarantined, reason: outbox.ReasonAccountUnconfirmed},
		{rule: "unauthorized", handler: stripeErr(403, "invalid_request_error", "", "", "forbidden"), outcome: deliverer.OutcomeQuarantined, reason: outbox.ReasonAccountUnconfirmed},
		{rule: "customer_unknown", handler: stripeErr(400, "invalid_request_error", "meter_event_customer_not_found", "payload[stripe_customer_id]", "no customer"), outcome: deliverer.OutcomeQuarantined, reason: outbox.ReasonCustomerMissing},
		{rule: "customer_unknown", handler: stripeErr(404, "invalid_request_error", "resource_missing", "customer", "No such customer"), outcome: deliverer.OutcomeQuarantined, reason: outbox.ReasonCustomerMissing},
		{rule: "meter_unknown", handler: stripeErr(400, "invalid_request_error", "no_meter", "event_name", "No active meter"), outcome: deliverer.OutcomeQuarantined, reason: outbox.ReasonProviderConfiguration},
		{rule: "payload_mismatch", handler: stripeErr(400, "invalid_request_error", "meter_event_value_not_found", "payload", "no value"), outcome: deliverer.OutcomeQuarantined, reason: outbox.ReasonProviderConfiguration},
		{rule: "timestamp_window", handler: stripeErr(400, "invalid_request_error", "timestamp_too_far_in_past", "timestamp", "too old"), outcome: deliverer.OutcomeQuarantined, reason: outbox.ReasonTimestampOutsideWindow},
		{rule: "invalid_request", handler: stripeErr(400, "invalid_request_error", "parameter_missing", "event_name", "Missing required param"), outcome: deliverer.OutcomeRejected},
		{rule: "invalid_request", handler: stripeErr(404, "invalid_request_error", "resource_missing", "", "Unrecognized request URL"), outcome: deliverer.OutcomeRejected},
		{rule: "other_4xx", handler: stripeErr(402, "card_error", "", "", "payment required"), outcome: deliverer.OutcomeRejected},
		{rule: "unexpected", handler: func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(304) }, outcome: deliverer.OutcomeUncertain},
	}
	covered := map[string]bool{}
	for _, c := range cases {
		covered[c.rule] = true
	}
	for _, r := range Rules() {
		if !covered[r.Name] {
			t.Errorf("rule %q has no test case", r.Name)
		}
	}
	for i, c := range cases {
		t.Run(fmt.Sprintf("%02d_%s", i, c.rule), func(t *testing.T) {
			t.Parallel()
			release := make(chan struct{})
			h := c.handler
			if c.timeout {
				h = func(w http.ResponseWriter, r *http.Request) {
					select {
					case <-release:
					case <-r.Context().Done():
					}
				}
			}
			srv := httptest.NewServer(http.HandlerFunc(h))
			base := srv.URL
			if c.refused {
				srv.Close()
			} else {
				defer srv.Close()
			}
			defer close(release) // runs before srv.Close
			exp, err := New(Config{APIKey: "sk_test_canned", APIBase: base}, 5*time.Second, 4)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if c.timeout {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, 200*time.Millisecond)
				defer cancel()
			}
			res := exp.Export(ctx, testReq)
			if res.Rule != c.rule || res.Outcome != c.outcome || res.Reason != c.reason {
				t.Fatalf("got rule %s outcome %s reason %q (status %d code %q), want %s %s %q",
					res.Rule, res.Outcome, res.Reason, res.HTTPStatus, res.ErrorCode, c.rule, c.outcome, c.reason)
			}
			if c.outcome == deliverer.OutcomeAccepted && res.ProviderRef == "" {
				t.Fatal("accepted without provider_ref")
			}
		})
	}
}

// TestRequestShape checks what goes on the wire: the key as identifier and
// Idempotency-Key, the mapping's names, no library retries, no telemetry,
// and a byte-identical body on every call.
func TestRequestShape(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var bodies []string
	var headers []http.Header
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, string(b))
		headers = append(headers, r.Header.Clone())
		mu.Unlock()
		if r.URL.Path != "/v1/billing/meter_events" || r.Method != http.MethodPost {
			w.WriteHeader(404)
			return
		}
		stripeErr(500, "api_error", "", "", "boom")(w, r)
	}))
	defer srv.Close()
	exp, err := New(Config{APIKey: "sk_test_shape", APIBase: srv.URL}, 5*time.Second, 4)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if res := exp.Export(context.Background(), testReq); res.Outcome != deliverer.OutcomeRetry {
			t.Fatalf("got %+v", res)
		}
	}
	if len(bodies) != 2 {
		t.Fatalf("library retried: %d requests for 2 calls", len(bodies))
	}
	if bodies[0] != bodies[1] {
		t.Fatalf("bodies differ:\n%s\n%s", bodies[0], bodies[1])
	}
	form, err := url.ParseQuery(bodies[0])
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"identifier": testReq.Key, "event_name": "api_calls", "timestamp": fmt.Sprint(testReq.Timestamp.Unix()),
		"payload[stripe_customer_id]": "cus_TEST", "payload[value]": "5",
	}
	for k, v := range want {
		if form.Get(k) != v {
			t.Errorf("%s = %q, want %q", k, form.Get(k), v)
		}
	}
	for _, h := range headers {
		if h.Get("Idempotency-Key") != testReq.Key {
			t.Errorf("Idempotency-Key %q", h.Get("Idempotency-Key"))
		}
		if h.Get("X-Stripe-Client-Telemetry") != "" {
			t.Error("telemetry header sent")
		}
		if h.Get("Authorization") != "Bearer sk_test_shape" {
			t.Error("authorization")
		}
	}
}

func TestConfig(t *testing.T) {
	t.Parallel()
	for key, mode := range map[string]identity.Mode{"sk_test_x": identity.ModeTest, "rk_live_y": identity.ModeLive, "pk_test_z": "", "": ""} {
		if KeyMode(key) != mode {
			t.Errorf("KeyMode(%q) = %q", key, KeyMode(key))
		}
	}
	err := Config{APIKey: "pk_test_secret", APIBase: "ftp://x"}.Validate()
	var re *config.RangeError
	if !errors.Is(err, config.ErrInvalid) || !errors.As(err, &re) {
		t.Fatalf("got %v", err)
	}
	if strings.Contains(err.Error(), "pk_test_secret") {
		t.Fatal("key leaked into the error")
	}
	if _, err := New(Config{APIKey: "sk_live_1", APIBase: DefaultAPIBase}, time.Second, 1); err != nil {
		t.Fatal(err)
	}
}

// TestDocsTable keeps docs/deliverer.md's table identical to Rules.
func TestDocsTable(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../docs/deliverer.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), MarkdownTable()) {
		t.Fatalf("docs/deliverer.md does not contain the current table; paste:\n%s", MarkdownTable())
	}
}
