package stripeexport

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/aurora-billing/aurora/deliverer"
)

// fakeStripe answers every request with the response in resp.
type fakeStripe struct{ resp func() *http.Response }

func (f *fakeStripe) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		_, _ = io.Copy(io.Discard, req.Body)
		_ = req.Body.Close()
	}
	r := f.resp()
	r.Request = req
	return r, nil
}

// FuzzAnswer: any Stripe answer (status, Request-Id and Content-Type
// headers, body) goes through stripe-go and the classification table
// (go test -fuzz '^FuzzAnswer$' ./deliverer/stripeexport). Seeds: the 2xx
// bodies in testdata/seed (copied from the shared data folder, see
// testdata/SOURCES.md) and Stripe's error shape; regressions in
// testdata/fuzz/FuzzAnswer/.
//
// Invariants: every answer gets a rule of the table and an outcome; the
// status is kept; a 2xx is accepted whatever its body; a 5xx, 409 or 429 is
// retried (or uncertain for an idempotency_error); a 1xx/3xx is uncertain;
// a reason is set exactly for a quarantine; the ProviderRef of an acceptance
// is the Request-Id or the key; and every text the deliverer stores
// (request id, error code, message, provider ref) is valid UTF-8 without NUL
// and bounded (one unstorable value fails a whole outcome batch in Postgres).
func FuzzAnswer(f *testing.F) {
	seeds, err := filepath.Glob("testdata/seed/*.json")
	if err != nil || len(seeds) == 0 {
		f.Fatalf("no seeds (%v)", err)
	}
	for _, name := range seeds {
		body, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(200, "req_123", "application/json", body)
	}
	for _, s := range []struct {
		status int
		body   string
	}{
		{400, `{"error":{"type":"invalid_request_error","code":"no_meter","message":"No active meter found","param":"event_name"}}`},
		{400, `{"error":{"type":"invalid_request_error","message":"An event already exists with identifier 1234-1234"}}`},
		{404, `{"error":{"type":"invalid_request_error","code":"resource_missing","param":"payload[stripe_customer_id]","message":"No such customer: 'cus_4QWKsZuuTHcs7X'"}}`},
		{400, `{"error":{"type":"idempotency_error","message":"Keys for idempotent requests can only be used with the same parameters"}}`},
		{429, `{"error":{"type":"invalid_request_error","code":"rate_limit"}}`},
		{409, `{"error":{"code":"idempotency_key_in_use"}}`},
		{500, `<html>oops</html>`},
		{502, ``},
		{302, `{"id":"x"}`},
		{400, "{\"error\":{\"code\":\"\\u0000\",\"message\":\"bad \\u0000 \\ud800\"}}"},
	} {
		f.Add(s.status, "req_\x00\xff", "application/json", []byte(s.body))
	}
	var cur *http.Response
	fake := &fakeStripe{resp: func() *http.Response { return cur }}
	e := newExporter(Config{APIKey: "sk_test_fuzz", APIBase: "http://stripe.invalid"}, 5*time.Second, fake)
	req := deliverer.Request{ItemID: 1, Key: strings.Repeat("ab", 32), EventName: "api_request", CustomerKey: "stripe_customer_id",
		ValueKey: "value", Customer: "cus_4QWKsZuuTHcs7X", Value: 25, Timestamp: time.Unix(1_234_567_890, 0)}
	outcomes := []deliverer.Outcome{deliverer.OutcomeAccepted, deliverer.OutcomeRetry, deliverer.OutcomeUncertain,
		deliverer.OutcomeRejected, deliverer.OutcomeQuarantined}
	f.Fuzz(func(t *testing.T, status int, requestID, contentType string, body []byte) {
		status = 100 + (status%900+900)%900
		h := http.Header{}
		h.Set("Request-Id", requestID)
		h.Set("Content-Type", contentType)
		cur = &http.Response{StatusCode: status, Status: http.StatusText(status), Header: h, ProtoMajor: 1, ProtoMinor: 1,
			Body: io.NopCloser(bytes.NewReader(body)), ContentLength: int64(len(body))}
		res := e.Export(context.Background(), req)
		if res.Rule == "" || !slices.Contains(outcomes, res.Outcome) {
			t.Fatalf("unclassified: %+v", res)
		}
		if (res.Reason != "") != (res.Outcome == deliverer.OutcomeQuarantined) {
			t.Fatalf("reason %q with outcome %s", res.Reason, res.Outcome)
		}
		if res.HTTPStatus != status {
			t.Fatalf("status %d recorded as %d", status, res.HTTPStatus)
		}
		switch {
		case status >= 200 && status < 300:
			if res.Outcome != deliverer.OutcomeAccepted {
				t.Fatalf("%d classified %s (%s)", status, res.Outcome, res.Rule)
			}
		case status >= 500 && status < 600, status == 409, status == 429:
			if res.Outcome != deliverer.OutcomeRetry && res.Rule != "idempotency_error" {
				t.Fatalf("%d classified %s (%s)", status, res.Outcome, res.Rule)
			}
		case status < 200, status >= 300 && status < 400, status >= 600:
			if res.Outcome != deliverer.OutcomeUncertain {
				t.Fatalf("%d classified %s (%s)", status, res.Outcome, res.Rule)
			}
		}
		if res.Outcome == deliverer.OutcomeAccepted && res.ProviderRef != req.Key && (res.ProviderRef == "" || res.ProviderRef != res.RequestID) {
			t.Fatalf("provider ref %q (request id %q)", res.ProviderRef, res.RequestID)
		}
		for name, s := range map[string]string{"request id": res.RequestID, "error code": res.ErrorCode, "message": res.Message, "provider ref": res.ProviderRef} {
			if !utf8.ValidString(s) || strings.ContainsRune(s, 0) || len(s) > MaxAnswerTextBytes {
				t.Fatalf("%s %q cannot be stored", name, s)
			}
		}
	})
}
