package inbox

import (
	"encoding/json"
	"time"
)

// ObjectThinEvent is the object of a thin event: what Stripe sends to an
// event destination with event_payload "thin" (the meter error reports
// v1.billing.meter.error_report_triggered and v1.billing.meter.no_meter_found
// among them). Its created is an RFC 3339 string, not Unix seconds, and it
// carries no data: the reconciler fetches the full event from
// /v2/core/events/{id}. The inbox verifies and stores it like every webhook
// and records it processed with outcome ignored (nothing to project).
const ObjectThinEvent = "v2.core.event"

// maxCreatedUnix is 9999-12-31T23:59:59Z, the last second RFC 3339 can
// write.
const maxCreatedUnix = 253402300799

// eventCreated reads an envelope's created: Unix seconds (v1 events) or an
// RFC 3339 string (thin v2 events). ok is false when it is absent, neither,
// or outside 1970-01-01T00:00:01Z..9999-12-31T23:59:59Z (maxCreatedUnix):
// such a time is no Stripe event's, and pgx's microsecond encoding
// overflows on a large one, so created 9223372036854775807 was stored as
// 1969-12-31T23:59:59Z and ordered the event wrongly against its
// neighbours (found by FuzzReadEnvelope).
func eventCreated(raw json.RawMessage) (time.Time, bool) {
	if len(raw) == 0 || string(raw) == "null" {
		return time.Time{}, false
	}
	var n int64
	if err := json.Unmarshal(raw, &n); err == nil {
		if n <= 0 || n > maxCreatedUnix {
			return time.Time{}, false
		}
		return time.Unix(n, 0).UTC(), true
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil || t.Unix() <= 0 || t.Unix() > maxCreatedUnix {
		return time.Time{}, false
	}
	return t.UTC().Truncate(time.Second), true
}
