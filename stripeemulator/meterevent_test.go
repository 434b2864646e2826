package stripeemulator_test

import (
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/stripeemulator"
	stripe "github.com/stripe/stripe-go/v76"
)

func TestMeterEventRules(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", stripeemulator.MaxIdentifierLength+1)
	cases := []struct {
		name       string
		params     func() *stripe.BillingMeterEventParams
		setup      func(e *env)
		wantStatus int    // 0 = success
		wantCode   string // Stripe error code
		wantParam  string
		wantInMsg  string
	}{
		{name: "applied", params: func() *stripe.BillingMeterEventParams { return event("id-ok", custA, "5", epoch) }},
		{name: "decimal value", params: func() *stripe.BillingMeterEventParams { return event("id-dec", custA, "2.5", epoch) }},
		{name: "no timestamp means now", params: func() *stripe.BillingMeterEventParams {
			p := event("id-nots", custA, "1", epoch)
			p.Timestamp = nil
			return p
		}},
		{name: "unknown event name", wantStatus: 400, wantCode: stripeemulator.CodeNoMeter, wantParam: "event_name",
			params: func() *stripe.BillingMeterEventParams {
				p := event("id-nometer", custA, "1", epoch)
				p.EventName = stripe.String("storage_gb")
				return p
			}},
		{name: "archived meter", wantStatus: 400, wantCode: stripeemulator.CodeArchivedMeter,
			setup: func(e *env) {
				if _, err := e.emu.SetMeterActive(e.meter.ID, false); err != nil {
					e.t.Fatal(err)
				}
			},
			params: func() *stripe.BillingMeterEventParams { return event("id-archived", custA, "1", epoch) }},
		{name: "unknown customer named", wantStatus: 400, wantCode: stripeemulator.CodeCustomerNotFound, wantInMsg: "cus_nobody",
			params: func() *stripe.BillingMeterEventParams { return event("id-nocus", "cus_nobody", "1", epoch) }},
		{name: "no customer key", wantStatus: 400, wantCode: stripeemulator.CodeNoCustomerDefined,
			params: func() *stripe.BillingMeterEventParams {
				p := event("id-nocuskey", custA, "1", epoch)
				delete(p.Payload, "stripe_customer_id")
				return p
			}},
		{name: "no value key", wantStatus: 400, wantCode: stripeemulator.CodeValueNotFound,
			params: func() *stripe.BillingMeterEventParams {
				p := event("id-noval", custA, "1", epoch)
				delete(p.Payload, "value")
				return p
			}},
		{name: "value not a number", wantStatus: 400, wantCode: stripeemulator.CodeInvalidValue,
			params: func() *stripe.BillingMeterEventParams { return event("id-nan", custA, "ten", epoch) }},
		{name: "value Inf refused", wantStatus: 400, wantCode: stripeemulator.CodeInvalidValue,
			params: func() *stripe.BillingMeterEventParams { return event("id-inf", custA, "Inf", epoch) }},
		{name: "15 significant digits", params: func() *stripe.BillingMeterEventParams { return event("id-15", custA, "999999999999999", epoch) }},
		{name: "15 significant digits with zeros around", params: func() *stripe.BillingMeterEventParams {
			return event("id-15z", custA, "000123456789012.345000", epoch)
		}},
		{name: "16 digits refused", wantStatus: 400, wantCode: stripeemulator.CodeValueTooManyDigits,
			params: func() *stripe.BillingMeterEventParams { return event("id-16", custA, "1000000000000000", epoch) }},
		{name: "19 digits refused", wantStatus: 400, wantCode: stripeemulator.CodeValueTooManyDigits,
			params: func() *stripe.BillingMeterEventParams { return event("id-19", custA, "9223372036854775807", epoch) }},
		{name: "16 significant decimal digits refused", wantStatus: 400, wantCode: stripeemulator.CodeValueTooManyDigits,
			params: func() *stripe.BillingMeterEventParams { return event("id-16d", custA, "0.1234567890123456", epoch) }},
		{name: "exactly 35 days old", params: func() *stripe.BillingMeterEventParams {
			return event("id-35d", custA, "1", epoch.Add(-35*24*time.Hour))
		}},
		{name: "35 days and 1 s old", wantStatus: 400, wantCode: stripeemulator.CodeTimestampTooFarInPast, wantParam: "timestamp",
			params: func() *stripe.BillingMeterEventParams {
				return event("id-35d1s", custA, "1", epoch.Add(-35*24*time.Hour-time.Second))
			}},
		{name: "exactly 5 min ahead", params: func() *stripe.BillingMeterEventParams {
			return event("id-5m", custA, "1", epoch.Add(5*time.Minute))
		}},
		{name: "5 min and 1 s ahead", wantStatus: 400, wantCode: stripeemulator.CodeTimestampInFuture, wantParam: "timestamp",
			params: func() *stripe.BillingMeterEventParams {
				return event("id-5m1s", custA, "1", epoch.Add(5*time.Minute+time.Second))
			}},
		{name: "identifier too long", wantStatus: 400, wantParam: "identifier", wantCode: stripeemulator.CodeParameterInvalid,
			params: func() *stripe.BillingMeterEventParams { return event(long, custA, "1", epoch) }},
		{name: "no event name", wantStatus: 400, wantCode: stripeemulator.CodeParameterMissing, wantParam: "event_name",
			params: func() *stripe.BillingMeterEventParams {
				p := event("id-noname", custA, "1", epoch)
				p.EventName = nil
				return p
			}},
		{name: "no payload", wantStatus: 400, wantCode: stripeemulator.CodeParameterMissing, wantParam: "payload",
			params: func() *stripe.BillingMeterEventParams {
				p := event("id-nopayload", custA, "1", epoch)
				p.Payload = nil
				return p
			}},
		{name: "unknown parameter", wantStatus: 400, wantCode: stripeemulator.CodeParameterUnknown, wantParam: "foo",
			params: func() *stripe.BillingMeterEventParams {
				p := event("id-unknown", custA, "1", epoch)
				p.AddExtra("foo", "bar")
				return p
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, stripeemulator.Config{})
			if tc.setup != nil {
				tc.setup(e)
			}
			p := tc.params()
			ev, err := e.sc.BillingMeterEvents.New(p)
			if tc.wantStatus == 0 {
				if err != nil {
					t.Fatalf("want success, got %v", err)
				}
				if ev.Object != "billing.meter_event" || ev.Identifier != *p.Identifier || ev.EventName != eventName {
					t.Fatalf("unexpected body %+v", ev)
				}
				if ev.LastResponse == nil || !strings.HasPrefix(ev.LastResponse.RequestID, "req_") {
					t.Fatalf("want a req_ Request-Id, got %+v", ev.LastResponse)
				}
				if got := e.emu.Applied(); len(got) != 1 || got[0].Identifier != *p.Identifier || got[0].Customer != custA {
					t.Fatalf("want one applied event, got %+v", got)
				}
				return
			}
			se := stripeErr(t, err)
			if se.HTTPStatusCode != tc.wantStatus || se.Type != stripe.ErrorTypeInvalidRequest || string(se.Code) != tc.wantCode {
				t.Fatalf("want %d invalid_request_error %q, got %d %s %q: %s", tc.wantStatus, tc.wantCode, se.HTTPStatusCode, se.Type, se.Code, se.Msg)
			}
			if tc.wantParam != "" && se.Param != tc.wantParam {
				t.Fatalf("want param %q, got %q", tc.wantParam, se.Param)
			}
			if !strings.Contains(se.Msg, tc.wantInMsg) {
				t.Fatalf("want %q in message, got %q", tc.wantInMsg, se.Msg)
			}
			if !strings.HasPrefix(se.RequestID, "req_") {
				t.Fatalf("want a req_ Request-Id, got %q", se.RequestID)
			}
			if got := e.emu.Applied(); len(got) != 0 {
				t.Fatalf("a refused event was applied: %+v", got)
			}
		})
	}
}

func TestDuplicateIdentifier(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stripeemulator.Config{})
	if _, err := e.sc.BillingMeterEvents.New(event("evt-1", custA, "3", epoch)); err != nil {
		t.Fatal(err)
	}

	// Same identifier under another Idempotency-Key: Stripe's duplicate 400.
	p := event("evt-1", custA, "3", epoch)
	p.SetIdempotencyKey("another-key")
	_, err := e.sc.BillingMeterEvents.New(p)
	se := stripeErr(t, err)
	if se.HTTPStatusCode != 400 || se.Type != stripe.ErrorTypeInvalidRequest || !strings.HasPrefix(se.Msg, stripeemulator.DuplicateIdentifierMessagePrefix+" evt-1") {
		t.Fatalf("want the duplicate 400, got %d %s %q", se.HTTPStatusCode, se.Type, se.Msg)
	}
	if got := se.LastResponse.Header.Get("Stripe-Should-Retry"); got != "false" {
		t.Fatalf("want Stripe-Should-Retry: false, got %q", got)
	}

	// Still a duplicate just before 24 h, even with other parameters.
	e.clock.Advance(24*time.Hour - time.Second)
	p = event("evt-1", custA, "7", epoch)
	p.SetIdempotencyKey("third-key")
	if _, err := e.sc.BillingMeterEvents.New(p); stripeErr(t, err).HTTPStatusCode != 400 {
		t.Fatalf("want duplicate within 24 h")
	}
	if n := e.emu.Applications("evt-1"); n != 1 {
		t.Fatalf("want 1 application, got %d", n)
	}
	if d := e.emu.DuplicateApplications(); len(d) != 0 {
		t.Fatalf("want no duplicate applications, got %v", d)
	}
	if c := e.emu.Counts(); c[stripeemulator.OutcomeDuplicate] != 2 || c[stripeemulator.OutcomeApplied] != 1 {
		t.Fatalf("counts %v", c)
	}

	// After the 24 h window the identifier is new again: applied twice,
	// which the oracle reports.
	e.clock.Advance(time.Second)
	p = event("evt-1", custA, "3", epoch.Add(24*time.Hour))
	p.SetIdempotencyKey("fourth-key")
	if _, err := e.sc.BillingMeterEvents.New(p); err != nil {
		t.Fatalf("want applied after the window, got %v", err)
	}
	if d := e.emu.DuplicateApplications(); len(d) != 1 || d[0] != "evt-1" {
		t.Fatalf("want evt-1 reported as applied twice, got %v", d)
	}
}

func TestIdempotencyKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stripeemulator.Config{})
	first, err := e.sc.BillingMeterEvents.New(event("evt-k", custA, "4", epoch))
	if err != nil {
		t.Fatal(err)
	}

	// Same key, same parameters: the saved response, replayed.
	again, err := e.sc.BillingMeterEvents.New(event("evt-k", custA, "4", epoch))
	if err != nil {
		t.Fatalf("want replay, got %v", err)
	}
	h := again.LastResponse.Header
	if h.Get("Idempotent-Replayed") != "true" || h.Get("Original-Request") != first.LastResponse.RequestID {
		t.Fatalf("want replay headers, got %v", h)
	}
	if string(again.LastResponse.RawJSON) != string(first.LastResponse.RawJSON) {
		t.Fatalf("replayed body differs:\n%s\n%s", again.LastResponse.RawJSON, first.LastResponse.RawJSON)
	}

	// Same key, other parameters: idempotency_error.
	_, err = e.sc.BillingMeterEvents.New(event("evt-k", custA, "5", epoch))
	se := stripeErr(t, err)
	if se.HTTPStatusCode != 400 || se.Type != stripe.ErrorTypeIdempotency {
		t.Fatalf("want 400 idempotency_error, got %d %s", se.HTTPStatusCode, se.Type)
	}
	var ie *stripe.IdempotencyError
	if !errors.As(err, &ie) {
		t.Fatalf("want *stripe.IdempotencyError inside, got %T", se.Err)
	}

	// Keys expire (24 h) but identifiers stay deduplicated: a resend under
	// the same key then gets the duplicate answer.
	e.emu.ForgetIdempotencyKeys()
	_, err = e.sc.BillingMeterEvents.New(event("evt-k", custA, "4", epoch))
	if se := stripeErr(t, err); !strings.HasPrefix(se.Msg, stripeemulator.DuplicateIdentifierMessagePrefix) {
		t.Fatalf("want the duplicate answer after the key is forgotten, got %q", se.Msg)
	}
	if n := e.emu.Applications("evt-k"); n != 1 {
		t.Fatalf("want 1 application, got %d", n)
	}
	c := e.emu.Counts()
	if c[stripeemulator.OutcomeReplayed] != 1 || c[stripeemulator.OutcomeIdempotencyMismatch] != 1 || c[stripeemulator.OutcomeDuplicate] != 1 {
		t.Fatalf("counts %v", c)
	}
}

func TestIdempotencyKeyExpiresWithClock(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stripeemulator.Config{IdempotencyTTL: time.Hour, DedupeWindow: 48 * time.Hour})
	if _, err := e.sc.BillingMeterEvents.New(event("evt-ttl", custA, "1", epoch)); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Hour)
	_, err := e.sc.BillingMeterEvents.New(event("evt-ttl", custA, "1", epoch))
	if se := stripeErr(t, err); se.HTTPStatusCode != 400 || !strings.HasPrefix(se.Msg, stripeemulator.DuplicateIdentifierMessagePrefix) {
		t.Fatalf("want duplicate once the key expired, got %d %q", se.HTTPStatusCode, se.Msg)
	}
}

// holder holds the meter event with one identifier in flight (slot held,
// key running) from Config.BeforeExecute until release.
type holder struct {
	id      string
	entered chan struct{}
	gate    chan struct{}
	once    sync.Once
}

func newHolder(t *testing.T, id string) *holder {
	h := &holder{id: id, entered: make(chan struct{}, 1), gate: make(chan struct{})}
	t.Cleanup(h.release)
	return h
}

func (h *holder) hook(identifier string) {
	if identifier == h.id {
		select {
		case h.entered <- struct{}{}:
		default: // a later execution of the same identifier
		}
		<-h.gate
	}
}

func (h *holder) release() { h.once.Do(func() { close(h.gate) }) }

func TestIdempotencyKeyInUse(t *testing.T) {
	t.Parallel()
	// The limiter off, so the second call reaches the idempotency layer
	// while the first still executes under the same key.
	h := newHolder(t, "evt-a")
	e := newEnv(t, stripeemulator.Config{AllowConcurrent: true, BeforeExecute: h.hook})
	done := make(chan error, 1)
	go func() {
		_, err := e.sc.BillingMeterEvents.New(event("evt-a", custA, "1", epoch))
		done <- err
	}()
	<-h.entered
	if st := e.emu.Stats(); st.Executing != 1 || st.InFlight != 1 {
		t.Fatalf("want one executing call, got %+v", st)
	}
	_, err := e.sc.BillingMeterEvents.New(event("evt-a", custA, "1", epoch))
	se := stripeErr(t, err)
	if se.HTTPStatusCode != http.StatusConflict || string(se.Code) != stripeemulator.CodeIdempotencyKeyInUse {
		t.Fatalf("want 409 idempotency_key_in_use, got %d %q", se.HTTPStatusCode, se.Code)
	}
	h.release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Not saved: once the first finished, the same call is a replay.
	r, err := e.sc.BillingMeterEvents.New(event("evt-a", custA, "1", epoch))
	if err != nil || r.LastResponse.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("want a replay, got %v", err)
	}
	if n := e.emu.Applications("evt-a"); n != 1 {
		t.Fatalf("want 1 application, got %d", n)
	}
	if c := e.emu.Counts(); c[stripeemulator.OutcomeKeyInUse] != 1 || c[stripeemulator.OutcomeOverlap] != 0 {
		t.Fatalf("counts %v", c)
	}
}

func TestOverlapPerCustomerAndMeter(t *testing.T) {
	t.Parallel()
	h := newHolder(t, "evt-1")
	e := newEnv(t, stripeemulator.Config{BeforeExecute: h.hook})
	done := make(chan error, 1)
	go func() {
		_, err := e.sc.BillingMeterEvents.New(event("evt-1", custA, "1", epoch))
		done <- err
	}()
	<-h.entered

	// Another customer on the same meter is free.
	if _, err := e.sc.BillingMeterEvents.New(event("evt-3", custB, "1", epoch)); err != nil {
		t.Fatalf("other customer: %v", err)
	}
	// The same (customer, meter): 429 rate_limit, counted, not processed.
	_, err := e.sc.BillingMeterEvents.New(event("evt-2", custA, "1", epoch))
	se := stripeErr(t, err)
	if se.HTTPStatusCode != http.StatusTooManyRequests || string(se.Code) != stripeemulator.CodeRateLimit {
		t.Fatalf("want 429 rate_limit, got %d %q", se.HTTPStatusCode, se.Code)
	}
	// Also with the same key as the running call: the limiter answers first.
	_, err = e.sc.BillingMeterEvents.New(event("evt-1", custA, "1", epoch))
	if se := stripeErr(t, err); se.HTTPStatusCode != http.StatusTooManyRequests {
		t.Fatalf("want 429 before the idempotency layer, got %d", se.HTTPStatusCode)
	}
	h.release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := e.emu.Overlaps(); got != 2 {
		t.Fatalf("want 2 overlaps, got %d", got)
	}
	if got := e.emu.OverlapsFor(eventName, custA); got != 2 {
		t.Fatalf("want 2 overlaps for cus_A, got %d", got)
	}
	if got := e.emu.OverlapsFor(eventName, custB); got != 0 {
		t.Fatalf("want 0 overlaps for cus_B, got %d", got)
	}
	// The refused call was not processed: a retry succeeds.
	if _, err := e.sc.BillingMeterEvents.New(event("evt-2", custA, "1", epoch)); err != nil {
		t.Fatalf("retry after 429: %v", err)
	}
	if n := len(e.emu.Applied()); n != 3 {
		t.Fatalf("want 3 applied, got %d", n)
	}
	if st := e.emu.Stats(); st.InFlight != 0 || st.Executing != 0 {
		t.Fatalf("slots leaked: %+v", st)
	}
}

// Sequential calls never overlap, however fast they follow each other: the
// slot is released before the answer is written.
func TestSequentialCallsNeverOverlap(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stripeemulator.Config{})
	for i := range 200 {
		if _, err := e.sc.BillingMeterEvents.New(event("seq-"+itoa(int64(i)), custA, "1", epoch)); err != nil {
			t.Fatal(err)
		}
	}
	if got := e.emu.Overlaps(); got != 0 {
		t.Fatalf("want 0 overlaps, got %d", got)
	}
}

func TestAllowConcurrentStillCounts(t *testing.T) {
	t.Parallel()
	h := newHolder(t, "evt-1")
	e := newEnv(t, stripeemulator.Config{AllowConcurrent: true, BeforeExecute: h.hook})
	done := make(chan error, 1)
	go func() {
		_, err := e.sc.BillingMeterEvents.New(event("evt-1", custA, "1", epoch))
		done <- err
	}()
	<-h.entered
	if _, err := e.sc.BillingMeterEvents.New(event("evt-2", custA, "1", epoch)); err != nil {
		t.Fatalf("want accepted with AllowConcurrent, got %v", err)
	}
	h.release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := e.emu.Overlaps(); got != 1 {
		t.Fatalf("want the overlap counted, got %d", got)
	}
}

// waitFor polls cond until it holds or 10 s pass.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10 s")
		}
		time.Sleep(2 * time.Millisecond)
	}
}
