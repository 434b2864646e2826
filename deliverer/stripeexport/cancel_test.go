package stripeexport

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/deliverer"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/aurora-billing/aurora/stripeemulator"
)

var testCancel = deliverer.CancelRequest{ItemID: 2, Key: strings.Repeat("cd", 32) + ":cancel", EventName: "api_calls", Identifier: testReq.Key}

// TestCancelClassificationTable answers every row of CancelRules from a
// canned server through the real stripe-go client. Every rule must be
// exercised.
func TestCancelClassificationTable(t *testing.T) {
	t.Parallel()
	ok := func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Request-Id", "req_ok")
		fmt.Fprintf(w, `{"object":"billing.meter_event_adjustment","event_name":"api_calls","status":"pending","type":"cancel","cancel":{"identifier":%q}}`, testReq.Key)
	}
	drop := func(w http.ResponseWriter, _ *http.Request) {
		c, _, _ := w.(http.Hijacker).Hijack()
		c.Close()
	}
	cases := []struct {
		rule    string
		handler http.HandlerFunc
		timeout bool
		outcome deliverer.Outcome
		reason  outbox.Reason
	}{
		{rule: "cancel_timeout", timeout: true, outcome: deliverer.OutcomeRetry},
		{rule: "cancel_connection_error", handler: drop, outcome: deliverer.OutcomeRetry},
		{rule: "cancel_2xx", handler: ok, outcome: deliverer.OutcomeAccepted},
		{rule: "cancel_already_cancelled", handler: stripeErr(400, "invalid_request_error", "parameter_invalid", "cancel[identifier]", "The meter event with identifier x is already cancelled."), outcome: deliverer.OutcomeAccepted},
		{rule: "cancel_idempotency_error", handler: stripeErr(400, "idempotency_error", "", "", "same parameters"), outcome: deliverer.OutcomeUncertain},
		{rule: "cancel_key_in_use", handler: stripeErr(409, "invalid_request_error", "idempotency_key_in_use", "", "in use"), outcome: deliverer.OutcomeRetry},
		{rule: "cancel_rate_limited", handler: stripeErr(429, "invalid_request_error", "rate_limit", "", "slow down"), outcome: deliverer.OutcomeRetry},
		{rule: "cancel_server_error", handler: stripeErr(503, "api_error", "", "", "unavailable"), outcome: deliverer.OutcomeRetry},
		{rule: "cancel_unauthorized", handler: stripeErr(401, "invalid_request_error", "", "", "bad key"), outcome: deliverer.OutcomeQuarantined, reason: outbox.ReasonAccountUnconfirmed},
		{rule: "cancel_window_passed", handler: stripeErr(400, "invalid_request_error", AdjustmentWindowPassedCode, "cancel[identifier]", "too late"), outcome: deliverer.OutcomeQuarantined, reason: outbox.ReasonNegativeQuantity},
		{rule: "cancel_meter_unknown", handler: stripeErr(400, "invalid_request_error", "parameter_invalid_string", "event_name", "different event_name"), outcome: deliverer.OutcomeQuarantined, reason: outbox.ReasonProviderConfiguration},
		{rule: "cancel_meter_unknown", handler: stripeErr(400, "invalid_request_error", "no_meter", "event_name", "no meter"), outcome: deliverer.OutcomeQuarantined, reason: outbox.ReasonProviderConfiguration},
		{rule: "cancel_identifier_unknown", handler: stripeErr(400, "invalid_request_error", "resource_missing", "cancel[identifier]", "No meter event found"), outcome: deliverer.OutcomeQuarantined, reason: outbox.ReasonNegativeQuantity},
		{rule: "cancel_refused", handler: stripeErr(400, "invalid_request_error", "parameter_missing", "type", "missing"), outcome: deliverer.OutcomeQuarantined, reason: outbox.ReasonNegativeQuantity},
		{rule: "cancel_unexpected", handler: func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(304) }, outcome: deliverer.OutcomeUncertain},
	}
	covered := map[string]bool{}
	for _, c := range cases {
		covered[c.rule] = true
	}
	for _, r := range CancelRules() {
		if !covered[r.Name] {
			t.Errorf("cancel rule %q has no test case", r.Name)
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
			srv := httptest.NewServer(h)
			defer srv.Close()
			defer close(release)
			exp, err := New(Config{APIKey: "sk_test_canned", APIBase: srv.URL}, 5*time.Second, 4)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if c.timeout {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, 200*time.Millisecond)
				defer cancel()
			}
			res := exp.Cancel(ctx, testCancel)
			if res.Rule != c.rule || res.Outcome != c.outcome || res.Reason != c.reason {
				t.Fatalf("got rule %s outcome %s reason %q (status %d code %q), want %s %s %q",
					res.Rule, res.Outcome, res.Reason, res.HTTPStatus, res.ErrorCode, c.rule, c.outcome, c.reason)
			}
		})
	}
}

// TestCancelAgainstEmulator: what the emulator answers to a cancel, a
// replay with the same Idempotency-Key (its saved 200), a second cancel
// with another key (already cancelled: done), a cancel of an identifier it
// never received (quarantine) and of another meter's event_name.
func TestCancelAgainstEmulator(t *testing.T) {
	t.Parallel()
	emu, err := stripeemulator.New(stripeemulator.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := emu.AddMeter(stripeemulator.MeterSpec{DisplayName: "API calls", EventName: "api_calls"}); err != nil {
		t.Fatal(err)
	}
	if _, err := emu.AddMeter(stripeemulator.MeterSpec{DisplayName: "Storage", EventName: "storage"}); err != nil {
		t.Fatal(err)
	}
	if err := emu.AddCustomer(testReq.Customer); err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(emu)
	defer hs.Close()
	exp, err := New(Config{APIKey: "sk_test_123", APIBase: hs.URL}, 10*time.Second, 2)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ev := testReq
	ev.Timestamp = time.Now().Add(-time.Minute)
	if res := exp.Export(ctx, ev); res.Outcome != deliverer.OutcomeAccepted {
		t.Fatalf("event: %+v", res)
	}
	other := testCancel
	other.Key = "another:cancel"
	unknown := testCancel
	unknown.Key, unknown.Identifier = "unknown:cancel", "never-sent"
	wrongMeter := testCancel
	wrongMeter.Key, wrongMeter.EventName = "wrong-meter:cancel", "storage"
	for i, c := range []struct {
		req     deliverer.CancelRequest
		rule    string
		outcome deliverer.Outcome
		reason  outbox.Reason
	}{
		{testCancel, "cancel_2xx", deliverer.OutcomeAccepted, ""},
		{testCancel, "cancel_2xx", deliverer.OutcomeAccepted, ""}, // replay of the same key
		{other, "cancel_already_cancelled", deliverer.OutcomeAccepted, ""},
		{unknown, "cancel_identifier_unknown", deliverer.OutcomeQuarantined, outbox.ReasonNegativeQuantity},
		// An event_name that is not the event's is refused before the
		// cancelled check: a configuration problem.
		{wrongMeter, "cancel_meter_unknown", deliverer.OutcomeQuarantined, outbox.ReasonProviderConfiguration},
	} {
		res := exp.Cancel(ctx, c.req)
		if res.Rule != c.rule || res.Outcome != c.outcome || res.Reason != c.reason {
			t.Fatalf("%d: %+v, want %s %s %q", i, res, c.rule, c.outcome, c.reason)
		}
	}
	var cancelled int
	for _, a := range emu.Applied() {
		if a.Cancelled {
			cancelled++
		}
	}
	if cancelled != 1 || emu.AppliedTotals()["api_calls"] != 0 {
		t.Fatalf("cancelled %d, total %v", cancelled, emu.AppliedTotals()["api_calls"])
	}
}

// TestCancelDocsTable keeps docs/deliverer.md's cancel table identical to
// CancelRules.
func TestCancelDocsTable(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../docs/deliverer.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), CancelMarkdownTable()) {
		t.Fatalf("docs/deliverer.md does not contain the current cancel table; paste:\n%s", CancelMarkdownTable())
	}
}
