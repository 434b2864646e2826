package stripeemulator_test

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/stripeemulator"
	stripe "github.com/stripe/stripe-go/v76"
)

func TestAuth(t *testing.T) {
	t.Parallel()
	keys := map[string]stripeemulator.Access{testKey: stripeemulator.AccessFull, "rk_test_readonly_5678": stripeemulator.AccessDenied}
	cases := []struct {
		name   string
		keys   map[string]stripeemulator.Access
		auth   string // Authorization header; "" = none
		status int
	}{
		{name: "configured key", keys: keys, auth: "Bearer " + testKey, status: 200},
		{name: "missing key", keys: keys, auth: "", status: 401},
		{name: "unknown key", keys: keys, auth: "Bearer sk_test_someoneelse_0000", status: 401},
		{name: "not bearer", keys: keys, auth: "Token " + testKey, status: 401},
		{name: "basic auth with key as user", keys: keys, auth: "Basic " + basic(testKey), status: 200},
		{name: "key without permission", keys: keys, auth: "Bearer rk_test_readonly_5678", status: 403},
		{name: "open mode test key", auth: "Bearer sk_test_anything", status: 200},
		{name: "open mode live key", auth: "Bearer sk_live_anything", status: 200},
		{name: "open mode publishable key", auth: "Bearer pk_test_anything", status: 401},
		{name: "open mode bare prefix", auth: "Bearer sk_test_", status: 401},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, stripeemulator.Config{Keys: tc.keys})
			r := e.do(http.MethodGet, "/v1/customers/"+custA, nil, map[string]string{"Authorization": tc.auth})
			if r.status != tc.status {
				t.Fatalf("want %d, got %d %s", tc.status, r.status, r.body)
			}
			if !strings.HasPrefix(r.header.Get("Request-Id"), "req_") {
				t.Fatalf("want a req_ Request-Id, got %q", r.header.Get("Request-Id"))
			}
			if tc.status != 200 {
				obj := r.errorObject(t)
				if obj["type"] != stripeemulator.TypeInvalidRequestError || obj["message"] == "" {
					t.Fatalf("error body %v", obj)
				}
				// The key is never echoed whole.
				if k := strings.TrimPrefix(strings.TrimPrefix(tc.auth, "Bearer "), "Token "); len(k) > 12 && strings.Contains(string(r.body), k) {
					t.Fatalf("the key leaked into the answer: %s", r.body)
				}
			}
		})
	}
	// The real client sees the same through *stripe.Error.
	e := newEnv(t, stripeemulator.Config{Keys: keys})
	_, err := stripeClient(e.srv.URL, "rk_test_readonly_5678", nil).BillingMeterEvents.New(event("e1", custA, "1", epoch))
	if se := stripeErr(t, err); se.HTTPStatusCode != 403 {
		t.Fatalf("want 403, got %d", se.HTTPStatusCode)
	}
	_, err = stripeClient(e.srv.URL, "sk_test_wrong_00000000", nil).BillingMeterEvents.New(event("e1", custA, "1", epoch))
	if se := stripeErr(t, err); se.HTTPStatusCode != 401 {
		t.Fatalf("want 401, got %d", se.HTTPStatusCode)
	}
	if len(e.emu.Applied()) != 0 {
		t.Fatal("an unauthenticated event was applied")
	}
	c := e.emu.Counts()
	if c[stripeemulator.OutcomeForbidden] != 1 || c[stripeemulator.OutcomeUnauthorized] != 1 {
		t.Fatalf("counts %v", c)
	}
}

func basic(user string) string {
	r, _ := http.NewRequest(http.MethodGet, "http://x", nil)
	r.SetBasicAuth(user, "")
	return strings.TrimPrefix(r.Header.Get("Authorization"), "Basic ")
}

func TestCustomers(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stripeemulator.Config{})
	p := &stripe.CustomerParams{Name: stripe.String("Ada"), Email: stripe.String("ada@example.test")}
	p.AddMetadata("tenant", "org_123")
	c, err := e.sc.Customers.New(p)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(c.ID, "cus_") || c.Object != "customer" || c.Name != "Ada" || c.Metadata["tenant"] != "org_123" || c.Created != epoch.Unix() {
		t.Fatalf("created %+v", c)
	}
	got, err := e.sc.Customers.Get(c.ID, nil)
	if err != nil || got.ID != c.ID || got.Email != "ada@example.test" {
		t.Fatalf("get: %+v %v", got, err)
	}
	// The customer can be billed at once.
	if _, err := e.sc.BillingMeterEvents.New(event("e-new", c.ID, "1", epoch)); err != nil {
		t.Fatal(err)
	}
	// Directly added customers are visible through the API.
	if got, err := e.sc.Customers.Get(custA, nil); err != nil || got.ID != custA {
		t.Fatalf("get cus_A: %+v %v", got, err)
	}
	_, err = e.sc.Customers.Get("cus_missing", nil)
	se := stripeErr(t, err)
	if se.HTTPStatusCode != 404 || string(se.Code) != stripeemulator.CodeResourceMissing {
		t.Fatalf("want 404 resource_missing, got %d %q", se.HTTPStatusCode, se.Code)
	}
	// Deleted customers are unknown to meter events.
	if _, err := e.sc.Customers.Del(custB, nil); err != nil {
		t.Fatal(err)
	}
	_, err = e.sc.BillingMeterEvents.New(event("e-del", custB, "1", epoch))
	if se := stripeErr(t, err); string(se.Code) != stripeemulator.CodeCustomerNotFound {
		t.Fatalf("want customer_not_found after delete, got %q", se.Code)
	}
	// Bad input is refused by name.
	for _, tc := range []struct {
		form url.Values
		code string
	}{
		{url.Values{"name": {strings.Repeat("n", 501)}}, stripeemulator.CodeParameterInvalid},
		{url.Values{"shoe_size": {"42"}}, stripeemulator.CodeParameterUnknown},
	} {
		r := e.do(http.MethodPost, "/v1/customers", tc.form, nil)
		if r.status != 400 || r.errorObject(t)["code"] != tc.code {
			t.Fatalf("want 400 %s, got %d %s", tc.code, r.status, r.body)
		}
	}
	if err := e.emu.AddCustomer(""); !errors.Is(err, stripeemulator.ErrInvalidCustomer) {
		t.Fatalf("want ErrInvalidCustomer, got %v", err)
	}
	if err := e.emu.AddCustomer(custA); err != nil {
		t.Fatalf("adding an existing customer is a no-op, got %v", err)
	}
	if e.emu.DeleteCustomer("cus_never") {
		t.Fatal("deleting an unknown customer reported true")
	}
}

func TestMeters(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stripeemulator.Config{})
	m, err := e.sc.BillingMeters.New(&stripe.BillingMeterParams{
		DisplayName:        stripe.String("Storage"),
		EventName:          stripe.String("storage_gb"),
		DefaultAggregation: &stripe.BillingMeterDefaultAggregationParams{Formula: stripe.String("sum")},
		CustomerMapping:    &stripe.BillingMeterCustomerMappingParams{EventPayloadKey: stripe.String("customer"), Type: stripe.String("by_id")},
		ValueSettings:      &stripe.BillingMeterValueSettingsParams{EventPayloadKey: stripe.String("gb")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(m.ID, "mtr_") || m.Status != stripe.BillingMeterStatusActive || m.CustomerMapping.EventPayloadKey != "customer" ||
		m.ValueSettings.EventPayloadKey != "gb" || m.DefaultAggregation.Formula != "sum" || m.Object != "billing.meter" {
		t.Fatalf("created %+v", m)
	}
	// Events use the meter's payload keys.
	p := &stripe.BillingMeterEventParams{EventName: stripe.String("storage_gb"), Identifier: stripe.String("s1"),
		Payload: map[string]string{"customer": custA, "gb": "12"}, Timestamp: stripe.Int64(epoch.Unix())}
	if _, err := e.sc.BillingMeterEvents.New(p); err != nil {
		t.Fatal(err)
	}
	if tot := e.emu.AppliedTotals(); tot["storage_gb"] != 12 {
		t.Fatalf("totals %v", tot)
	}
	got, err := e.sc.BillingMeters.Get(m.ID, nil)
	if err != nil || got.EventName != "storage_gb" {
		t.Fatalf("get: %+v %v", got, err)
	}
	if _, err := e.sc.BillingMeters.Get("mtr_missing", nil); stripeErr(t, err).HTTPStatusCode != 404 {
		t.Fatal("want 404")
	}
	// A second active meter for the same event name is refused.
	_, err = e.sc.BillingMeters.New(&stripe.BillingMeterParams{DisplayName: stripe.String("x"), EventName: stripe.String("storage_gb"),
		DefaultAggregation: &stripe.BillingMeterDefaultAggregationParams{Formula: stripe.String("sum")}})
	if stripeErr(t, err).HTTPStatusCode != 400 {
		t.Fatal("want 400 for a duplicate event_name")
	}
	// Required parameters.
	_, err = e.sc.BillingMeters.New(&stripe.BillingMeterParams{DisplayName: stripe.String("x"), EventName: stripe.String("y")})
	if se := stripeErr(t, err); string(se.Code) != stripeemulator.CodeParameterMissing || se.Param != "default_aggregation[formula]" {
		t.Fatalf("want parameter_missing default_aggregation[formula], got %q %q", se.Code, se.Param)
	}
	// List, newest first, paginated by the iterator.
	for _, n := range []string{"m3", "m4", "m5"} {
		if _, err := e.emu.AddMeter(stripeemulator.MeterSpec{DisplayName: n, EventName: n, Aggregation: stripeemulator.AggregationCount}); err != nil {
			t.Fatal(err)
		}
	}
	lp := &stripe.BillingMeterListParams{}
	lp.Limit = stripe.Int64(2)
	var names []string
	it := e.sc.BillingMeters.List(lp)
	for it.Next() {
		names = append(names, it.BillingMeter().EventName)
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	if strings.Join(names, ",") != "m5,m4,m3,storage_gb,api_calls" {
		t.Fatalf("list order %v", names)
	}
	// Deactivate: events become archived_meter; reactivate restores.
	if _, err := e.sc.BillingMeters.Deactivate(m.ID, nil); err != nil {
		t.Fatal(err)
	}
	p.Identifier = stripe.String("s2")
	if _, err := e.sc.BillingMeterEvents.New(p); string(stripeErr(t, err).Code) != stripeemulator.CodeArchivedMeter {
		t.Fatal("want archived_meter")
	}
	inactive := &stripe.BillingMeterListParams{Status: stripe.String("inactive")}
	it = e.sc.BillingMeters.List(inactive)
	if !it.Next() || it.BillingMeter().ID != m.ID || it.Next() {
		t.Fatalf("want only the deactivated meter in status=inactive")
	}
	if _, err := e.sc.BillingMeters.Reactivate(m.ID, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := e.sc.BillingMeterEvents.New(p); err != nil {
		t.Fatalf("want applied after reactivation, got %v", err)
	}
	if ms := e.emu.Meters(); len(ms) != 5 || ms[0].ID != e.meter.ID || ms[1].ID != m.ID || !ms[1].Active {
		t.Fatalf("Meters(): %+v", ms)
	}
	// Reactivating an active meter, or one whose event name another active
	// meter took meanwhile, is refused.
	if _, err := e.sc.BillingMeters.Reactivate(m.ID, nil); stripeErr(t, err).HTTPStatusCode != 400 {
		t.Fatal("want 400 reactivating an active meter")
	}
	if _, err := e.emu.SetMeterActive(m.ID, false); err != nil {
		t.Fatal(err)
	}
	if _, err := e.emu.AddMeter(stripeemulator.MeterSpec{DisplayName: "Storage v2", EventName: "storage_gb"}); err != nil {
		t.Fatalf("a new meter may take an inactive meter's event name: %v", err)
	}
	if _, err := e.emu.SetMeterActive(m.ID, true); !errors.Is(err, stripeemulator.ErrInvalidMeter) {
		t.Fatalf("want ErrInvalidMeter for an event-name clash, got %v", err)
	}
	if _, err := e.emu.AddMeter(stripeemulator.MeterSpec{EventName: "no_display"}); !errors.Is(err, stripeemulator.ErrInvalidMeter) {
		t.Fatalf("want ErrInvalidMeter, got %v", err)
	}
	if _, err := e.emu.SetMeterActive("mtr_nope", false); !errors.Is(err, stripeemulator.ErrInvalidMeter) {
		t.Fatalf("want ErrInvalidMeter, got %v", err)
	}
}

func TestEventSummaries(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stripeemulator.Config{})
	day := time.Date(2026, 9, 1, 0, 0, 0, 0, time.UTC) // epoch is 12:00 that day
	send := func(id, cust, v string, at time.Time) {
		t.Helper()
		if _, err := e.sc.BillingMeterEvents.New(event(id, cust, v, at)); err != nil {
			t.Fatal(err)
		}
	}
	send("a", custA, "1", day.Add(1*time.Hour))                // 01:00
	send("b", custA, "2", day.Add(1*time.Hour+59*time.Minute)) // 01:59
	send("c", custA, "4", day.Add(2*time.Hour))                // 02:00
	send("d", custA, "8", day.Add(-time.Second))               // previous day
	send("e", custB, "16", day.Add(1*time.Hour))               // other customer
	send("f", custA, "32", day.Add(3*time.Hour))               // cancelled below
	if _, err := e.sc.BillingMeterEventAdjustments.New(&stripe.BillingMeterEventAdjustmentParams{
		EventName: stripe.String(eventName), Type: stripe.String("cancel"),
		Cancel: &stripe.BillingMeterEventAdjustmentCancelParams{Identifier: stripe.String("f")},
	}); err != nil {
		t.Fatal(err)
	}

	list := func(cust string, start, end time.Time, window string, limit int64) ([]*stripe.BillingMeterEventSummary, error) {
		p := &stripe.BillingMeterEventSummaryListParams{ID: stripe.String(e.meter.ID), Customer: stripe.String(cust),
			StartTime: stripe.Int64(start.Unix()), EndTime: stripe.Int64(end.Unix())}
		if window != "" {
			p.ValueGroupingWindow = stripe.String(window)
		}
		if limit > 0 {
			p.Limit = stripe.Int64(limit)
		}
		var out []*stripe.BillingMeterEventSummary
		it := e.sc.BillingMeterEventSummaries.List(p)
		for it.Next() {
			out = append(out, it.BillingMeterEventSummary())
		}
		return out, it.Err()
	}
	values := func(s []*stripe.BillingMeterEventSummary) []float64 {
		var v []float64
		for _, x := range s {
			v = append(v, x.AggregatedValue)
		}
		return v
	}
	cases := []struct {
		name       string
		cust       string
		start, end time.Time
		window     string
		limit      int64
		want       []float64
	}{
		{name: "whole day, cancelled left out", cust: custA, start: day, end: day.Add(24 * time.Hour), want: []float64{7}},
		{name: "start inclusive end exclusive", cust: custA, start: day.Add(time.Hour), end: day.Add(2 * time.Hour), want: []float64{3}},
		{name: "minute-aligned range", cust: custA, start: day.Add(time.Hour + 59*time.Minute), end: day.Add(2*time.Hour + time.Minute), want: []float64{6}},
		{name: "hour windows", cust: custA, start: day, end: day.Add(4 * time.Hour), window: "hour", want: []float64{0, 3, 4, 0}},
		{name: "hour windows paginated", cust: custA, start: day, end: day.Add(4 * time.Hour), window: "hour", limit: 1, want: []float64{0, 3, 4, 0}},
		{name: "day windows", cust: custA, start: day.Add(-24 * time.Hour), end: day.Add(24 * time.Hour), window: "day", want: []float64{8, 7}},
		{name: "other customer", cust: custB, start: day, end: day.Add(24 * time.Hour), want: []float64{16}},
	}
	for _, tc := range cases {
		got, err := list(tc.cust, tc.start, tc.end, tc.window, tc.limit)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if v := values(got); !equalFloats(v, tc.want) {
			t.Fatalf("%s: got %v, want %v", tc.name, v, tc.want)
		}
		for _, s := range got {
			if s.Meter != e.meter.ID || s.Object != "billing.meter_event_summary" || s.EndTime <= s.StartTime {
				t.Fatalf("%s: summary %+v", tc.name, s)
			}
		}
	}
	// The Go view agrees with the API.
	if s := e.emu.Summaries(eventName, custA, day, day.Add(4*time.Hour), time.Hour); len(s) != 4 || s[1].AggregatedValue != 3 || s[2].AggregatedValue != 4 {
		t.Fatalf("Summaries %+v", s)
	}

	bad := []struct {
		name   string
		cust   string
		start  time.Time
		end    time.Time
		window string
		status int
	}{
		{name: "end before start", cust: custA, start: day.Add(time.Hour), end: day, status: 400},
		{name: "not minute aligned", cust: custA, start: day.Add(time.Second), end: day.Add(time.Hour), status: 400},
		{name: "hour window not hour aligned", cust: custA, start: day.Add(time.Minute), end: day.Add(time.Hour), window: "hour", status: 400},
		{name: "day window not midnight", cust: custA, start: day.Add(time.Hour), end: day.Add(25 * time.Hour), window: "day", status: 400},
		{name: "unknown window", cust: custA, start: day, end: day.Add(time.Hour), window: "week", status: 400},
		{name: "unknown customer", cust: "cus_nobody", start: day, end: day.Add(time.Hour), status: 400},
	}
	for _, tc := range bad {
		_, err := list(tc.cust, tc.start, tc.end, tc.window, 0)
		if se := stripeErr(t, err); se.HTTPStatusCode != tc.status {
			t.Fatalf("%s: want %d, got %d %s", tc.name, tc.status, se.HTTPStatusCode, se.Msg)
		}
	}
	r := e.do(http.MethodGet, "/v1/billing/meters/mtr_nope/event_summaries",
		url.Values{"customer": {custA}, "start_time": {itoa(day.Unix())}, "end_time": {itoa(day.Add(time.Hour).Unix())}}, nil)
	if r.status != 404 {
		t.Fatalf("unknown meter: want 404, got %d", r.status)
	}
	r = e.do(http.MethodGet, "/v1/billing/meters/"+e.meter.ID+"/event_summaries", url.Values{"customer": {custA}, "end_time": {"60"}}, nil)
	if r.status != 400 || r.errorObject(t)["param"] != "start_time" {
		t.Fatalf("missing start_time: %d %s", r.status, r.body)
	}
}

func equalFloats(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestCountMeterSummaries(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stripeemulator.Config{})
	m, err := e.emu.AddMeter(stripeemulator.MeterSpec{DisplayName: "Logins", EventName: "logins", Aggregation: stripeemulator.AggregationCount})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"l1", "l2", "l3"} {
		p := &stripe.BillingMeterEventParams{EventName: stripe.String("logins"), Identifier: stripe.String(id),
			Payload: map[string]string{"stripe_customer_id": custA, "value": "10"}, Timestamp: stripe.Int64(epoch.Unix())}
		if _, err := e.sc.BillingMeterEvents.New(p); err != nil {
			t.Fatal(err)
		}
	}
	it := e.sc.BillingMeterEventSummaries.List(&stripe.BillingMeterEventSummaryListParams{ID: stripe.String(m.ID), Customer: stripe.String(custA),
		StartTime: stripe.Int64(epoch.Add(-time.Hour).Unix()), EndTime: stripe.Int64(epoch.Add(time.Hour).Unix())})
	if !it.Next() || it.BillingMeterEventSummary().AggregatedValue != 3 {
		t.Fatalf("want a count of 3, err %v", it.Err())
	}
}

func TestAdjustments(t *testing.T) {
	t.Parallel()
	cancel := func(name, id string) *stripe.BillingMeterEventAdjustmentParams {
		return &stripe.BillingMeterEventAdjustmentParams{EventName: stripe.String(name), Type: stripe.String("cancel"),
			Cancel: &stripe.BillingMeterEventAdjustmentCancelParams{Identifier: stripe.String(id)}}
	}
	cases := []struct {
		name    string
		advance time.Duration
		params  *stripe.BillingMeterEventAdjustmentParams
		status  int
		code    string
	}{
		{name: "cancel at once", params: cancel(eventName, "evt-1"), status: 200},
		{name: "cancel at 24 h", advance: 24 * time.Hour, params: cancel(eventName, "evt-1"), status: 200},
		{name: "cancel after 24 h", advance: 24*time.Hour + time.Second, params: cancel(eventName, "evt-1"), status: 400, code: stripeemulator.CodeAdjustmentWindowPassed},
		{name: "unknown identifier", params: cancel(eventName, "evt-404"), status: 400, code: stripeemulator.CodeResourceMissing},
		{name: "other event name", params: cancel("storage_gb", "evt-1"), status: 400, code: stripeemulator.CodeParameterInvalid},
		{name: "no identifier", params: &stripe.BillingMeterEventAdjustmentParams{EventName: stripe.String(eventName), Type: stripe.String("cancel")}, status: 400, code: stripeemulator.CodeParameterMissing},
		{name: "no event name", params: &stripe.BillingMeterEventAdjustmentParams{Type: stripe.String("cancel"),
			Cancel: &stripe.BillingMeterEventAdjustmentCancelParams{Identifier: stripe.String("evt-1")}}, status: 400, code: stripeemulator.CodeParameterMissing},
		{name: "other type", params: &stripe.BillingMeterEventAdjustmentParams{EventName: stripe.String(eventName), Type: stripe.String("void"),
			Cancel: &stripe.BillingMeterEventAdjustmentCancelParams{Identifier: stripe.String("evt-1")}}, status: 400, code: stripeemulator.CodeParameterInvalid},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, stripeemulator.Config{})
			if _, err := e.sc.BillingMeterEvents.New(event("evt-1", custA, "5", epoch)); err != nil {
				t.Fatal(err)
			}
			e.clock.Advance(tc.advance)
			adj, err := e.sc.BillingMeterEventAdjustments.New(tc.params)
			if tc.status == 200 {
				if err != nil {
					t.Fatal(err)
				}
				if adj.Object != "billing.meter_event_adjustment" || adj.Cancel.Identifier != "evt-1" || adj.Type != "cancel" || adj.Status != "pending" {
					t.Fatalf("adjustment %+v", adj)
				}
				ev := e.emu.Applied()[0]
				if !ev.Cancelled || !ev.CancelledAt.Equal(epoch.Add(tc.advance)) {
					t.Fatalf("want cancelled, got %+v", ev)
				}
				if tot := e.emu.AppliedTotals(); tot[eventName] != 0 {
					t.Fatalf("a cancelled event still counts: %v", tot)
				}
				// A second cancel is refused; a resend of the event stays a duplicate.
				_, err := e.sc.BillingMeterEventAdjustments.New(cancel(eventName, "evt-1"))
				if stripeErr(t, err).HTTPStatusCode != 400 {
					t.Fatal("want 400 for a second cancel")
				}
				return
			}
			se := stripeErr(t, err)
			if se.HTTPStatusCode != tc.status || string(se.Code) != tc.code {
				t.Fatalf("want %d %q, got %d %q: %s", tc.status, tc.code, se.HTTPStatusCode, se.Code, se.Msg)
			}
			if e.emu.Applied()[0].Cancelled {
				t.Fatal("a refused cancel took effect")
			}
		})
	}
}

func TestUnknownRouteAndMethod(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stripeemulator.Config{})
	for _, tc := range []struct{ method, path string }{
		{http.MethodGet, "/v1/charges"},
		{http.MethodGet, "/v1/billing/meter_events"},
		{http.MethodPut, "/v1/customers/cus_A"},
	} {
		r := e.do(tc.method, tc.path, nil, nil)
		if r.status != 404 || r.errorObject(t)["code"] != stripeemulator.CodeResourceMissing || r.header.Get("Content-Type") != "application/json" {
			t.Fatalf("%s %s: %d %s", tc.method, tc.path, r.status, r.body)
		}
	}
}

func TestHeaders(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stripeemulator.Config{})
	r := e.do(http.MethodPost, "/v1/billing/meter_events", eventForm("h1", custA, "1", epoch),
		map[string]string{"Idempotency-Key": "h1", "Stripe-Version": "2023-10-16"})
	if r.status != 200 || r.header.Get("Stripe-Version") != "2023-10-16" || r.header.Get("Idempotency-Key") != "h1" {
		t.Fatalf("%d %v", r.status, r.header)
	}
	// No Idempotency-Key: no replay, the identifier rule answers.
	r = e.do(http.MethodPost, "/v1/billing/meter_events", eventForm("h1", custA, "1", epoch), nil)
	if r.status != 400 || r.header.Get("Stripe-Should-Retry") != "false" {
		t.Fatalf("%d %v %s", r.status, r.header, r.body)
	}
	// A form that cannot be decoded.
	req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/v1/billing/meter_events", strings.NewReader("event_name=%zz"))
	req.Header.Set("Authorization", "Bearer "+testKey)
	res, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 400 || !json.Valid(b) {
		t.Fatalf("undecodable form: %d %s", res.StatusCode, b)
	}
	// An oversized body.
	big := url.Values{"event_name": {strings.Repeat("x", 70<<10)}}
	if r := e.do(http.MethodPost, "/v1/billing/meter_events", big, nil); r.status != 400 {
		t.Fatalf("oversized body: %d", r.status)
	}
	// Generated identifier when none is sent.
	form := eventForm("", custA, "1", epoch)
	form.Del("identifier")
	r = e.do(http.MethodPost, "/v1/billing/meter_events", form, nil)
	var ev struct{ Identifier string }
	if r.status != 200 || json.Unmarshal(r.body, &ev) != nil || !strings.HasPrefix(ev.Identifier, "mevt_") {
		t.Fatalf("generated identifier: %d %s", r.status, r.body)
	}
}

func TestStatsEndpointAndRequestLog(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stripeemulator.Config{RequestLogLimit: 3})
	for _, id := range []string{"s1", "s2", "s3", "s4"} {
		if _, err := e.sc.BillingMeterEvents.New(event(id, custA, "2", epoch)); err != nil {
			t.Fatal(err)
		}
	}
	res, err := http.Get(e.srv.URL + "/_emulator/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var s stripeemulator.Stats
	if err := json.NewDecoder(res.Body).Decode(&s); err != nil {
		t.Fatal(err)
	}
	if s.Requests != 4 || s.Applied != 4 || s.AppliedTotals[eventName] != 8 || s.Outcomes[stripeemulator.OutcomeApplied] != 4 || s.DuplicateApplications != 0 {
		t.Fatalf("stats %+v", s)
	}
	recs := e.emu.Requests()
	if len(recs) != 3 || recs[0].Identifier != "s2" || recs[2].Seq != 4 {
		t.Fatalf("request log bounded to 3, oldest dropped: %+v", recs)
	}
	for _, r := range recs {
		if r.Route != stripeemulator.RouteMeterEventCreate || r.Status != 200 {
			t.Fatalf("record %+v", r)
		}
	}
}

func TestAsyncValidation(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stripeemulator.Config{AsyncValidation: true})
	// Stripe's way: 200 now, not applied, an error report later.
	ev, err := e.sc.BillingMeterEvents.New(event("a-1", "cus_nobody", "1", epoch))
	if err != nil || ev.Identifier != "a-1" {
		t.Fatalf("want 200 for an unknown customer with AsyncValidation, got %v", err)
	}
	p := event("a-2", custA, "1", epoch)
	p.EventName = stripe.String("no_such_meter")
	if _, err := e.sc.BillingMeterEvents.New(p); err != nil {
		t.Fatal(err)
	}
	if _, err := e.sc.BillingMeterEvents.New(event("a-3", custA, "1", epoch.Add(-36*24*time.Hour))); err != nil {
		t.Fatal(err)
	}
	if n := len(e.emu.Applied()); n != 0 {
		t.Fatalf("rejected events were applied: %d", n)
	}
	reps := e.emu.ErrorReports()
	want := []string{stripeemulator.CodeCustomerNotFound, stripeemulator.CodeNoMeter, stripeemulator.CodeTimestampTooFarInPast}
	if len(reps) != len(want) {
		t.Fatalf("reports %+v", reps)
	}
	for i, r := range reps {
		if r.Code != want[i] || !r.ReceivedAt.Equal(epoch) {
			t.Fatalf("report %d: %+v, want code %s", i, r, want[i])
		}
	}
	if c := e.emu.Counts(); c[stripeemulator.OutcomeErrorReported] != 3 {
		t.Fatalf("counts %v", c)
	}
	// The 200 is saved under the key: a same-key resend replays it and
	// still applies nothing (why reconciliation must catch these).
	if _, err := e.sc.BillingMeterEvents.New(event("a-1", "cus_nobody", "1", epoch)); err != nil {
		t.Fatal(err)
	}
	if n := len(e.emu.Applied()); n != 0 {
		t.Fatalf("a replay applied: %d", n)
	}
	// Valid events are applied as usual.
	if _, err := e.sc.BillingMeterEvents.New(event("a-4", custA, "1", epoch)); err != nil || len(e.emu.Applied()) != 1 {
		t.Fatalf("valid event: %v", err)
	}
}

func TestControlEndpoints(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stripeemulator.Config{})
	post := func(path string, form url.Values) (int, string) {
		t.Helper()
		res, err := http.PostForm(e.srv.URL+path, form)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	if s, b := post("/_emulator/customers", url.Values{"id": {"cus_fixed"}}); s != 200 {
		t.Fatalf("customers: %d %s", s, b)
	}
	if !e.emu.HasCustomer("cus_fixed") {
		t.Fatal("customer not provisioned")
	}
	if s, b := post("/_emulator/script", url.Values{"identifier": {"c-1"}, "answers": {"500,ok"}}); s != 200 {
		t.Fatalf("script: %d %s", s, b)
	}
	_, err := e.sc.BillingMeterEvents.New(event("c-1", "cus_fixed", "1", epoch))
	if stripeErr(t, err).HTTPStatusCode != 500 {
		t.Fatal("want the scripted 500")
	}
	if _, err := e.sc.BillingMeterEvents.New(event("c-1", "cus_fixed", "1", epoch)); err != nil {
		t.Fatal(err)
	}
	if s, b := post("/_emulator/forget-idempotency-keys", nil); s != 200 {
		t.Fatalf("forget: %d %s", s, b)
	}
	_, err = e.sc.BillingMeterEvents.New(event("c-1", "cus_fixed", "1", epoch))
	if se := stripeErr(t, err); !strings.HasPrefix(se.Msg, stripeemulator.DuplicateIdentifierMessagePrefix) {
		t.Fatalf("want duplicate after forgetting keys, got %q", se.Msg)
	}
	if s, b := post("/_emulator/faults", url.Values{"faults": {"http429=1"}}); s != 200 {
		t.Fatalf("faults: %d %s", s, b)
	}
	if st := e.emu.Stats(); st.Faults != "http429=1" {
		t.Fatalf("faults not set: %+v", st)
	}
	for _, bad := range []struct {
		path string
		form url.Values
	}{
		{"/_emulator/faults", url.Values{"faults": {"http500=7"}}},
		{"/_emulator/script", url.Values{"identifier": {"x"}, "answers": {"418"}}},
		{"/_emulator/script", url.Values{"answers": {"500"}}},
		{"/_emulator/customers", url.Values{}},
	} {
		if s, b := post(bad.path, bad.form); s != 400 || !strings.Contains(b, `"invalid_request_error"`) {
			t.Fatalf("%s %v: want 400, got %d %s", bad.path, bad.form, s, b)
		}
	}
	res, err := http.Get(e.srv.URL + "/_emulator/applied")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	var applied struct {
		Data []struct {
			Identifier string  `json:"identifier"`
			Value      float64 `json:"value"`
		} `json:"data"`
	}
	if err := json.Unmarshal(b, &applied); err != nil || len(applied.Data) != 1 || applied.Data[0].Identifier != "c-1" {
		t.Fatalf("applied: %s %v", b, err)
	}
	if strings.Contains(string(b), "cus_fixed") {
		t.Fatalf("a customer id leaked: %s", b)
	}
}

func TestListPagination(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stripeemulator.Config{})
	day := time.Date(2026, 9, 1, 0, 0, 0, 0, time.UTC)
	path := "/v1/billing/meters/" + e.meter.ID + "/event_summaries"
	base := url.Values{"customer": {custA}, "start_time": {itoa(day.Unix())}, "end_time": {itoa(day.Add(5 * time.Hour).Unix())},
		"value_grouping_window": {"hour"}}
	type page struct {
		HasMore bool `json:"has_more"`
		Data    []struct {
			ID        string `json:"id"`
			StartTime int64  `json:"start_time"`
		} `json:"data"`
	}
	get := func(extra url.Values) (page, rawResponse) {
		t.Helper()
		q := url.Values{}
		for k, v := range base {
			q[k] = v
		}
		for k, v := range extra {
			q[k] = v
		}
		r := e.do(http.MethodGet, path, q, nil)
		var p page
		if r.status == 200 {
			if err := json.Unmarshal(r.body, &p); err != nil {
				t.Fatal(err)
			}
		}
		return p, r
	}
	all, _ := get(url.Values{"limit": {"100"}})
	if len(all.Data) != 5 || all.HasMore {
		t.Fatalf("all: %+v", all)
	}
	first, _ := get(url.Values{"limit": {"2"}})
	if len(first.Data) != 2 || !first.HasMore || first.Data[0].ID != all.Data[0].ID {
		t.Fatalf("first page: %+v", first)
	}
	next, _ := get(url.Values{"limit": {"2"}, "starting_after": {first.Data[1].ID}})
	if len(next.Data) != 2 || next.Data[0].ID != all.Data[2].ID || !next.HasMore {
		t.Fatalf("second page: %+v", next)
	}
	prev, _ := get(url.Values{"limit": {"2"}, "ending_before": {all.Data[4].ID}})
	if len(prev.Data) != 2 || prev.Data[0].ID != all.Data[2].ID || prev.Data[1].ID != all.Data[3].ID || !prev.HasMore {
		t.Fatalf("ending_before page: %+v", prev)
	}
	for _, bad := range []url.Values{
		{"limit": {"0"}},
		{"limit": {"101"}},
		{"limit": {"ten"}},
		{"starting_after": {"mtrusg_nope"}},
		{"starting_after": {all.Data[0].ID}, "ending_before": {all.Data[4].ID}},
	} {
		if _, r := get(bad); r.status != 400 {
			t.Fatalf("%v: want 400, got %d %s", bad, r.status, r.body)
		}
	}
	// Meters: newest first, ending_before walks back.
	for _, n := range []string{"m2", "m3"} {
		if _, err := e.emu.AddMeter(stripeemulator.MeterSpec{DisplayName: n, EventName: n}); err != nil {
			t.Fatal(err)
		}
	}
	r := e.do(http.MethodGet, "/v1/billing/meters", url.Values{"limit": {"1"}, "ending_before": {e.meter.ID}}, nil)
	var meters struct {
		HasMore bool `json:"has_more"`
		Data    []struct {
			EventName string `json:"event_name"`
		} `json:"data"`
	}
	if r.status != 200 || json.Unmarshal(r.body, &meters) != nil || len(meters.Data) != 1 || meters.Data[0].EventName != "m2" || !meters.HasMore {
		t.Fatalf("meters ending_before: %d %s", r.status, r.body)
	}
	if r := e.do(http.MethodGet, "/v1/billing/meters", url.Values{"starting_after": {"mtr_nope"}}, nil); r.status != 400 {
		t.Fatalf("unknown cursor: %d", r.status)
	}
}
