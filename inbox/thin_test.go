package inbox

import (
	"net/http"
	"testing"
	"time"
)

// A thin meter error report (Stripe's thin-event shape: object v2.core.event,
// created an RFC 3339 string, related_object the meter) is stored with a
// 2xx and processed without projection; it was a permanent 400 before.
func TestThinMeterErrorReportIsStored(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, id, body string
		wantCreated    time.Time
	}{
		{"error_report_triggered", "evt_thin1",
			`{"id":"evt_thin1","object":"v2.core.event","type":"v1.billing.meter.error_report_triggered","created":"2026-09-15T09:12:03.512Z","livemode":false,"context":null,"reason":null,"related_object":{"id":"mtr_123","type":"billing.meter","url":"/v1/billing/meters/mtr_123"}}`,
			time.Date(2026, 9, 15, 9, 12, 3, 0, time.UTC)},
		{"no_meter_found without related_object", "evt_thin2",
			`{"id":"evt_thin2","object":"v2.core.event","type":"v1.billing.meter.no_meter_found","created":"2026-09-15T09:12:03Z","livemode":false,"context":null,"reason":null}`,
			time.Date(2026, 9, 15, 9, 12, 3, 0, time.UTC)},
	}
	e := newEnv(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := post(t, e.handler, []byte(tt.body), testSecret, time.Now())
			if rec.Code != http.StatusOK {
				t.Fatalf("status %d body %q", rec.Code, rec.Body.String())
			}
			var created time.Time
			var typ string
			if err := e.pool.QueryRow(t.Context(), `SELECT event_type, event_created FROM billing_events WHERE event_id = $1`, tt.id).Scan(&typ, &created); err != nil {
				t.Fatal(err)
			}
			if !created.Equal(tt.wantCreated) {
				t.Fatalf("event_created %s, want %s", created, tt.wantCreated)
			}
		})
	}
	e.drain()
	for _, tt := range tests {
		if r := e.row(tt.id); !r.processed || r.outcome != string(OutcomeIgnored) {
			t.Fatalf("%s: %+v", tt.id, r)
		}
	}
	// a created that is neither Unix seconds nor RFC 3339 still cannot be projected
	bad := `{"id":"evt_thin3","object":"v2.core.event","type":"v1.billing.meter.error_report_triggered","created":"yesterday"}`
	if rec := post(t, e.handler, []byte(bad), testSecret, time.Now()); rec.Code != http.StatusOK {
		t.Fatalf("stored verbatim like every verified event: %d", rec.Code)
	}
	e.drain()
	if r := e.row("evt_thin3"); !r.deadLetter {
		t.Fatalf("evt_thin3: %+v", r)
	}
}
