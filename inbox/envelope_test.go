package inbox

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// A verified event whose envelope cannot be stored is a permanent 422,
// counted unstorable (not store_failed), stores nothing, and does not cost
// the good events around it their 200.
func TestWebhookUnstorableEnvelopeIs422(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	reg := newTestRegistry()
	m := NewMetrics(reg, nil)
	e.handler.metrics = m
	tests := []struct {
		name, body, field string
	}{
		{"NUL in the event id", `{"id":"evt_\u0000b","type":"invoice.paid","created":1700000000}`, "id"},
		{"lone surrogate in the event id", `{"id":"evt_\ud800","type":"invoice.paid"}`, "id"},
		{"invalid UTF-8 in the event id", "{\"id\":\"evt_\xff\",\"type\":\"invoice.paid\"}", "id"},
		{"event id longer than 255 bytes", `{"id":"evt_` + strings.Repeat("x", 300) + `","type":"invoice.paid"}`, "id"},
		{"newline in the type", `{"id":"evt_t","type":"invoice\npaid"}`, "type"},
		{"NUL in the api_version", `{"id":"evt_a","type":"invoice.paid","api_version":"2020\u0000"}`, "api_version"},
		{"NUL in the customer", `{"id":"evt_c","type":"invoice.paid","data":{"object":{"customer":"cus_\u0000"}}}`, "data.object.customer"},
	}
	for _, tt := range tests {
		rec := post(t, e.handler, []byte(tt.body), testSecret, time.Now())
		if rec.Code != http.StatusUnprocessableEntity {
			t.Errorf("%s: %d %s, want 422", tt.name, rec.Code, rec.Body)
			continue
		}
		if !strings.Contains(rec.Body.String(), tt.field) {
			t.Errorf("%s: answer %q does not name %s", tt.name, rec.Body, tt.field)
		}
		_, err := readEnvelope([]byte(tt.body))
		var ee *EnvelopeError
		if !errors.As(err, &ee) || ee.Field != tt.field || !errors.Is(err, ErrUnstorable) {
			t.Errorf("%s: readEnvelope error %v, want *EnvelopeError for %s wrapping ErrUnstorable", tt.name, err, tt.field)
		}
	}
	good := subscription(t, "customer.subscription.created", "evt_good", 1700000000, "cus_g", "sub_g", "active", "price_g")
	if rec := post(t, e.handler, good, testSecret, time.Now()); rec.Code != http.StatusOK {
		t.Fatalf("good event after the unstorable ones: %d", rec.Code)
	}
	if n := e.count(`SELECT count(*) FROM billing_events`); n != 1 {
		t.Fatalf("rows stored: %d, want only the good one", n)
	}
	if got := testutil.ToFloat64(m.webhooks.WithLabelValues(resultUnstorable)); got != float64(len(tests)) {
		t.Fatalf("unstorable counted %v, want %d", got, len(tests))
	}
	if got := testutil.ToFloat64(m.webhooks.WithLabelValues(resultStoreFailed)); got != 0 {
		t.Fatalf("store_failed counted %v, want 0 (an unstorable event is not an outage)", got)
	}
	if strings.Contains(e.logs.String(), "cus_") || strings.Contains(e.logs.String(), "evt_") {
		t.Fatal("an id reached the log")
	}
}

// A verified event whose created lies past year 9999 is stored with no
// created time, not with an overflowed one (9223372036854775807 became
// 1969-12-31T23:59:59Z; found by FuzzReadEnvelope); a header whose first t= is old and whose
// last t= is the signed one is judged on the signed one (FuzzSignatureHeader).
func TestWebhookCreatedOutOfRangeStored(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for i, created := range []string{`99999999999999`, `"10000-01-01T00:00:00Z"`, `9223372036854775807`} {
		body := []byte(`{"id":"evt_far` + strings.Repeat("x", i) + `","type":"invoice.paid","created":` + created + `}`)
		if rec := post(t, e.handler, body, testSecret, time.Now()); rec.Code != http.StatusOK {
			t.Fatalf("created %s: %d %s, want 200", created, rec.Code, rec.Body)
		}
	}
	if n := e.count(`SELECT count(*) FROM billing_events WHERE event_created IS NULL`); n != 3 {
		t.Fatalf("stored without created: %d, want 3", n)
	}
	if ts, ok := signatureTimestamp("t=1,t=1700000000,v1=ab"); !ok || ts.Unix() != 1700000000 {
		t.Fatalf("signatureTimestamp read %v %v, want the last t=", ts, ok)
	}
	for _, bad := range []string{"t=1=2,v1=ab", "t=x,v1=ab", "v1=ab"} {
		if _, ok := signatureTimestamp(bad); ok {
			t.Fatalf("signatureTimestamp accepted %q", bad)
		}
	}
}
