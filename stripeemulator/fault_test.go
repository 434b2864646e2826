package stripeemulator_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/stripeemulator"
	stripe "github.com/stripe/stripe-go/v76"
)

func TestParseFaults(t *testing.T) {
	t.Parallel()
	cases := []struct {
		spec    string
		want    stripeemulator.Faults
		bad     bool
		wantErr string // substring of the FaultSpecError's Item
	}{
		{spec: "", want: stripeemulator.Faults{}},
		{spec: "drop-after-apply=0.1,http500=0.1,http429=0.1,latency=20ms",
			want: stripeemulator.Faults{DropAfterApply: 0.1, HTTP500: 0.1, HTTP429: 0.1, Latency: 20 * time.Millisecond, LatencyMax: 20 * time.Millisecond}},
		{spec: " latency=10ms-50ms , timeout=0.2, http500-saved=0.3, cut-after-apply=0.1 ",
			want: stripeemulator.Faults{Latency: 10 * time.Millisecond, LatencyMax: 50 * time.Millisecond, Timeout: 0.2, HTTP500Saved: 0.3, CutAfterApply: 0.1}},
		{spec: "http500=1", want: stripeemulator.Faults{HTTP500: 1}},
		{spec: "http500=2", bad: true, wantErr: "http500=2"},
		{spec: "http500=-0.1", bad: true, wantErr: "http500=-0.1"},
		{spec: "http500=abc", bad: true, wantErr: "http500=abc"},
		{spec: "http500=NaN", bad: true, wantErr: "http500=NaN"},
		{spec: "http503=0.1", bad: true, wantErr: "http503=0.1"},
		{spec: "http500", bad: true, wantErr: "http500"},
		{spec: "http500=", bad: true, wantErr: "http500="},
		{spec: "http500=0.1,http500=0.2", bad: true, wantErr: "http500=0.2"},
		{spec: "latency=fast", bad: true, wantErr: "latency=fast"},
		{spec: "latency=-5ms", bad: true, wantErr: "latency=-5ms"},
		{spec: "latency=50ms-10ms", bad: true, wantErr: "latency=50ms-10ms"},
		{spec: "http500=0.6,http429=0.6", bad: true, wantErr: "http429=0.6"},
		{spec: "http500=0.1,,http429=0.1", bad: true, wantErr: ""},
	}
	for _, tc := range cases {
		t.Run(tc.spec, func(t *testing.T) {
			got, err := stripeemulator.ParseFaults(tc.spec)
			if !tc.bad {
				if err != nil {
					t.Fatalf("ParseFaults(%q): %v", tc.spec, err)
				}
				if got != tc.want {
					t.Fatalf("ParseFaults(%q) = %+v, want %+v", tc.spec, got, tc.want)
				}
				again, err := stripeemulator.ParseFaults(got.String())
				if err != nil || again != got {
					t.Fatalf("String() does not round-trip: %q → %+v, %v", got.String(), again, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("ParseFaults(%q) = %+v, want an error", tc.spec, got)
			}
			if !errors.Is(err, stripeemulator.ErrInvalidFaults) {
				t.Fatalf("want errors.Is ErrInvalidFaults, got %v", err)
			}
			var fe *stripeemulator.FaultSpecError
			if !errors.As(err, &fe) || fe.Reason == "" || !strings.Contains(fe.Item, tc.wantErr) {
				t.Fatalf("want a *FaultSpecError naming %q, got %#v", tc.wantErr, err)
			}
		})
	}
}

func TestParseAnswer(t *testing.T) {
	t.Parallel()
	cases := []struct {
		in   string
		want stripeemulator.Answer
		err  bool
	}{
		{in: "ok", want: stripeemulator.Answer{Kind: stripeemulator.AnswerNormal}},
		{in: "200", want: stripeemulator.Answer{Kind: stripeemulator.AnswerNormal}},
		{in: "429", want: stripeemulator.Answer{Kind: stripeemulator.AnswerHTTP429}},
		{in: "500", want: stripeemulator.Answer{Kind: stripeemulator.AnswerHTTP500}},
		{in: "500-saved", want: stripeemulator.Answer{Kind: stripeemulator.AnswerHTTP500Saved}},
		{in: "409", want: stripeemulator.Answer{Kind: stripeemulator.AnswerHTTP409}},
		{in: "401", want: stripeemulator.Answer{Kind: stripeemulator.AnswerHTTP401}},
		{in: "403", want: stripeemulator.Answer{Kind: stripeemulator.AnswerHTTP403}},
		{in: "drop", want: stripeemulator.Answer{Kind: stripeemulator.AnswerDrop}},
		{in: "drop-after-apply", want: stripeemulator.Answer{Kind: stripeemulator.AnswerDropAfterApply}},
		{in: "timeout", want: stripeemulator.Answer{Kind: stripeemulator.AnswerTimeout}},
		{in: "cut-after-apply", want: stripeemulator.Answer{Kind: stripeemulator.AnswerCutAfterApply}},
		{in: "400:no_meter", want: stripeemulator.Answer{Kind: stripeemulator.AnswerHTTP400, Code: "no_meter"}},
		{in: "400", want: stripeemulator.Answer{Kind: stripeemulator.AnswerHTTP400, Code: stripeemulator.CodeParameterInvalid}},
		{in: "400:", err: true},
		{in: "418", err: true},
		{in: "", err: true},
	}
	for _, tc := range cases {
		got, err := stripeemulator.ParseAnswer(tc.in)
		if tc.err {
			var ae *stripeemulator.AnswerError
			if !errors.Is(err, stripeemulator.ErrInvalidAnswer) || !errors.As(err, &ae) || ae.Answer != tc.in {
				t.Errorf("ParseAnswer(%q): want *AnswerError, got %v", tc.in, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseAnswer(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
		if again, err := stripeemulator.ParseAnswer(got.String()); err != nil || again != got {
			t.Errorf("String() of %+v does not round-trip: %q", got, got.String())
		}
	}
	q, err := stripeemulator.ParseAnswers("500, drop-after-apply,ok")
	if err != nil || len(q) != 3 || q[1].Kind != stripeemulator.AnswerDropAfterApply {
		t.Fatalf("ParseAnswers: %v %v", q, err)
	}
	if _, err := stripeemulator.ParseAnswers("500,nope"); !errors.Is(err, stripeemulator.ErrInvalidAnswer) {
		t.Fatalf("ParseAnswers with a bad item: %v", err)
	}
}

// noKeepAlive is an HTTP client that opens a connection per request, so a
// dropped connection surfaces as an error instead of Go's transparent
// retry of a request carrying an Idempotency-Key on a reused connection.
func noKeepAlive() *http.Client {
	return &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
}

func TestScriptedAnswers(t *testing.T) {
	t.Parallel()
	type want struct {
		status  int // 0 = connection error
		code    string
		typ     stripe.ErrorType
		applied int // applications of the identifier after this answer
		outcome stripeemulator.Outcome
	}
	cases := []struct {
		name   string
		script string
		wants  []want // one per attempt, all with the same key and body
	}{
		{name: "500 then ok: not saved, retry applies", script: "500", wants: []want{
			{status: 500, typ: stripe.ErrorTypeAPI, outcome: stripeemulator.OutcomeServerError},
			{status: 200, applied: 1, outcome: stripeemulator.OutcomeApplied},
		}},
		{name: "429 then ok", script: "429", wants: []want{
			{status: 429, code: stripeemulator.CodeRateLimit, typ: stripe.ErrorTypeInvalidRequest, outcome: stripeemulator.OutcomeRateLimited},
			{status: 200, applied: 1, outcome: stripeemulator.OutcomeApplied},
		}},
		{name: "409 then ok", script: "409", wants: []want{
			{status: 409, code: stripeemulator.CodeIdempotencyKeyInUse, typ: stripe.ErrorTypeInvalidRequest, outcome: stripeemulator.OutcomeKeyInUse},
			{status: 200, applied: 1, outcome: stripeemulator.OutcomeApplied},
		}},
		{name: "drop-after-apply then replay", script: "drop-after-apply", wants: []want{
			{status: 0, applied: 1, outcome: stripeemulator.OutcomeDropped},
			{status: 200, applied: 1, outcome: stripeemulator.OutcomeReplayed},
		}},
		{name: "cut-after-apply then replay", script: "cut-after-apply", wants: []want{
			{status: 0, applied: 1, outcome: stripeemulator.OutcomeDropped},
			{status: 200, applied: 1, outcome: stripeemulator.OutcomeReplayed},
		}},
		{name: "drop before apply then ok", script: "drop", wants: []want{
			{status: 0, applied: 0, outcome: stripeemulator.OutcomeDropped},
			{status: 200, applied: 1, outcome: stripeemulator.OutcomeApplied},
		}},
		{name: "500-saved replays until the key expires", script: "500-saved", wants: []want{
			{status: 500, typ: stripe.ErrorTypeAPI, outcome: stripeemulator.OutcomeServerError},
			{status: 500, typ: stripe.ErrorTypeAPI, outcome: stripeemulator.OutcomeReplayed},
		}},
		{name: "400 with a code", script: "400:meter_event_customer_not_found", wants: []want{
			{status: 400, code: stripeemulator.CodeCustomerNotFound, typ: stripe.ErrorTypeInvalidRequest, outcome: stripeemulator.OutcomeInvalid},
			{status: 200, applied: 1, outcome: stripeemulator.OutcomeApplied},
		}},
		{name: "401 then 403 then ok", script: "401,403", wants: []want{
			{status: 401, typ: stripe.ErrorTypeInvalidRequest, outcome: stripeemulator.OutcomeUnauthorized},
			{status: 403, typ: stripe.ErrorTypeInvalidRequest, outcome: stripeemulator.OutcomeForbidden},
			{status: 200, applied: 1, outcome: stripeemulator.OutcomeApplied},
		}},
		{name: "ok then duplicate via new key is not scripted", script: "ok", wants: []want{
			{status: 200, applied: 1, outcome: stripeemulator.OutcomeApplied},
			{status: 200, applied: 1, outcome: stripeemulator.OutcomeReplayed},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, stripeemulator.Config{})
			sc := stripeClient(e.srv.URL, testKey, noKeepAlive())
			answers, err := stripeemulator.ParseAnswers(tc.script)
			if err != nil {
				t.Fatal(err)
			}
			e.emu.Script("evt-s", answers...)
			for i, w := range tc.wants {
				_, err := sc.BillingMeterEvents.New(event("evt-s", custA, "2", epoch))
				switch {
				case w.status == 200:
					if err != nil {
						t.Fatalf("attempt %d: want 200, got %v", i+1, err)
					}
				case w.status == 0:
					var se *stripe.Error
					if err == nil || errors.As(err, &se) {
						t.Fatalf("attempt %d: want a connection error, got %v", i+1, err)
					}
				default:
					se := stripeErr(t, err)
					if se.HTTPStatusCode != w.status || string(se.Code) != w.code || se.Type != w.typ {
						t.Fatalf("attempt %d: want %d %s %q, got %d %s %q", i+1, w.status, w.typ, w.code, se.HTTPStatusCode, se.Type, se.Code)
					}
				}
				if n := e.emu.Applications("evt-s"); n != w.applied {
					t.Fatalf("attempt %d: want %d applications, got %d", i+1, w.applied, n)
				}
				recs := e.emu.RequestsFor("evt-s")
				if len(recs) != i+1 || recs[i].Outcome != w.outcome {
					t.Fatalf("attempt %d: want outcome %s, got %+v", i+1, w.outcome, recs)
				}
			}
			// Every attempt carried the same key and a byte-identical body.
			recs := e.emu.RequestsFor("evt-s")
			for _, r := range recs[1:] {
				if r.IdempotencyKey != "evt-s" || r.BodySHA256 != recs[0].BodySHA256 {
					t.Fatalf("attempts differ: %+v", recs)
				}
			}
		})
	}
}

func TestSavedServerErrorClearsWhenKeyExpires(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stripeemulator.Config{})
	e.emu.Script("evt-x", stripeemulator.Answer{Kind: stripeemulator.AnswerHTTP500Saved})
	if _, err := e.sc.BillingMeterEvents.New(event("evt-x", custA, "1", epoch)); stripeErr(t, err).HTTPStatusCode != 500 {
		t.Fatal("want 500")
	}
	e.clock.Advance(stripeemulator.IdempotencyTTLDefault)
	if _, err := e.sc.BillingMeterEvents.New(event("evt-x", custA, "1", epoch.Add(stripeemulator.IdempotencyTTLDefault))); err != nil {
		t.Fatalf("want applied once the saved 500 expired, got %v", err)
	}
	if n := e.emu.Applications("evt-x"); n != 1 {
		t.Fatalf("want 1 application, got %d", n)
	}
}

// TestDropAfterApplyOnReusedConnection documents Go's net/http behaviour:
// a POST carrying Idempotency-Key on a reused keep-alive connection that is
// closed before any response byte is retried once by the transport itself.
// The caller sees the replayed 200; the emulator sees two requests with the
// same key and body and applies the event once. (On a fresh connection the
// caller sees the error instead; whether the pooled connection is back in
// the pool is up to the transport, so the test observes it with httptrace
// and tries until the reused case happened.)
func TestDropAfterApplyOnReusedConnection(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stripeemulator.Config{})
	for try := range 50 {
		id := "evt-d" + itoa(int64(try))
		if _, err := e.sc.BillingMeterEvents.New(event("warm-"+id, custB, "1", epoch)); err != nil {
			t.Fatal(err) // puts a connection in the pool
		}
		e.emu.Script(id, stripeemulator.Answer{Kind: stripeemulator.AnswerDropAfterApply})
		var mu sync.Mutex
		var reused []bool
		p := event(id, custA, "1", epoch)
		p.Context = httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) {
			mu.Lock()
			reused = append(reused, i.Reused)
			mu.Unlock()
		}})
		r, err := e.sc.BillingMeterEvents.New(p)
		mu.Lock()
		firstReused := len(reused) > 0 && reused[0]
		mu.Unlock()
		recs := e.emu.RequestsFor(id)
		if n := e.emu.Applications(id); n != 1 {
			t.Fatalf("want 1 application, got %d", n)
		}
		if !firstReused {
			// A fresh connection: no transparent retry, the caller sees it.
			if err == nil || len(recs) != 1 {
				t.Fatalf("fresh connection: want an error and one request, got %v, %+v", err, recs)
			}
			continue
		}
		if err != nil {
			t.Fatalf("want the transport's transparent retry to succeed, got %v", err)
		}
		if r.LastResponse.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("want the replayed response")
		}
		if len(recs) != 2 || recs[0].Outcome != stripeemulator.OutcomeDropped || recs[1].Outcome != stripeemulator.OutcomeReplayed ||
			recs[0].BodySHA256 != recs[1].BodySHA256 {
			t.Fatalf("want dropped then replayed with the same body, got %+v", recs)
		}
		return
	}
	t.Fatal("the pooled connection was never reused in 50 tries")
}

// TestCutAfterApplyOnReusedConnection: unlike a drop, a response cut after
// its headers is not retried by the transport; the caller sees the error
// even on a warm keep-alive connection, and its own retry gets the replay.
func TestCutAfterApplyOnReusedConnection(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stripeemulator.Config{})
	if _, err := e.sc.BillingMeterEvents.New(event("warm-up", custB, "1", epoch)); err != nil {
		t.Fatal(err)
	}
	e.emu.Script("evt-c", stripeemulator.Answer{Kind: stripeemulator.AnswerCutAfterApply})
	_, err := e.sc.BillingMeterEvents.New(event("evt-c", custA, "1", epoch))
	var se *stripe.Error
	if err == nil || errors.As(err, &se) {
		t.Fatalf("want a transport error, got %v", err)
	}
	if n := e.emu.Applications("evt-c"); n != 1 {
		t.Fatalf("want applied once before the cut, got %d", n)
	}
	r, err := e.sc.BillingMeterEvents.New(event("evt-c", custA, "1", epoch))
	if err != nil || r.LastResponse.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("want the replay, got %v", err)
	}
	if recs := e.emu.RequestsFor("evt-c"); len(recs) != 2 || recs[0].BodySHA256 != recs[1].BodySHA256 {
		t.Fatalf("records %+v", recs)
	}
}

func TestTimeoutAnswer(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stripeemulator.Config{})
	hc := noKeepAlive()
	hc.Timeout = 100 * time.Millisecond
	sc := stripeClient(e.srv.URL, testKey, hc)
	e.emu.Script("evt-t", stripeemulator.Answer{Kind: stripeemulator.AnswerTimeout})
	_, err := sc.BillingMeterEvents.New(event("evt-t", custA, "1", epoch))
	var se *stripe.Error
	if err == nil || errors.As(err, &se) {
		t.Fatalf("want a client timeout, got %v", err)
	}
	waitFor(t, func() bool { return e.emu.Counts()[stripeemulator.OutcomeTimeout] == 1 })
	if n := e.emu.Applications("evt-t"); n != 0 {
		t.Fatalf("a timed-out request was applied")
	}
	// Not processed, nothing saved: the retry applies.
	if _, err := sc.BillingMeterEvents.New(event("evt-t", custA, "1", epoch)); err != nil {
		t.Fatal(err)
	}
	if n := e.emu.Applications("evt-t"); n != 1 {
		t.Fatalf("want 1 application, got %d", n)
	}
}

func TestTimeoutHoldEnds(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stripeemulator.Config{TimeoutHold: 20 * time.Millisecond})
	e.emu.Script("evt-h", stripeemulator.Answer{Kind: stripeemulator.AnswerTimeout})
	_, err := stripeClient(e.srv.URL, testKey, noKeepAlive()).BillingMeterEvents.New(event("evt-h", custA, "1", epoch))
	var se *stripe.Error
	if err == nil || errors.As(err, &se) {
		t.Fatalf("want the connection closed after TimeoutHold, got %v", err)
	}
}

// outcomes sends one attempt for each identifier and returns the outcomes.
func outcomes(t *testing.T, f stripeemulator.Faults, seed uint64, ids []string) []stripeemulator.Outcome {
	t.Helper()
	e := newEnv(t, stripeemulator.Config{Faults: f, Seed: seed})
	sc := stripeClient(e.srv.URL, testKey, noKeepAlive())
	var out []stripeemulator.Outcome
	for _, id := range ids {
		_, _ = sc.BillingMeterEvents.New(event(id, custA, "1", epoch))
		recs := e.emu.RequestsFor(id)
		if len(recs) != 1 {
			t.Fatalf("want one request for %s, got %d", id, len(recs))
		}
		out = append(out, recs[0].Outcome)
	}
	// The oracle holds under faults too.
	if d := e.emu.DuplicateApplications(); len(d) != 0 {
		t.Fatalf("duplicate applications under faults: %v", d)
	}
	return out
}

func TestRandomFaultsDeterministic(t *testing.T) {
	t.Parallel()
	f, err := stripeemulator.ParseFaults("drop-after-apply=0.2,http500=0.2,http429=0.2")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range 60 {
		ids = append(ids, "evt-"+itoa(int64(i)))
	}
	a := outcomes(t, f, 7, ids)
	b := outcomes(t, f, 7, ids)
	c := outcomes(t, f, 8, ids)
	seen := map[stripeemulator.Outcome]int{}
	same := true
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("same seed, different outcome for %s: %s vs %s", ids[i], a[i], b[i])
		}
		if a[i] != c[i] {
			same = false
		}
		seen[a[i]]++
	}
	if same {
		t.Fatalf("seeds 7 and 8 gave identical outcomes")
	}
	for _, o := range []stripeemulator.Outcome{stripeemulator.OutcomeApplied, stripeemulator.OutcomeDropped, stripeemulator.OutcomeServerError, stripeemulator.OutcomeRateLimited} {
		if seen[o] == 0 {
			t.Fatalf("60 draws at these rates never produced %s: %v", o, seen)
		}
	}
}

func TestRateOneAlwaysFaults(t *testing.T) {
	t.Parallel()
	for _, o := range outcomes(t, stripeemulator.Faults{HTTP500: 1}, 1, []string{"a", "b", "c", "d"}) {
		if o != stripeemulator.OutcomeServerError {
			t.Fatalf("http500=1 gave %s", o)
		}
	}
}

func TestLatencyFault(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stripeemulator.Config{Faults: stripeemulator.Faults{Latency: 30 * time.Millisecond, LatencyMax: 40 * time.Millisecond}})
	start := time.Now()
	if _, err := e.sc.BillingMeterEvents.New(event("evt-l", custA, "1", epoch)); err != nil {
		t.Fatal(err)
	}
	// A lower bound only: the emulator must not answer early.
	if d := time.Since(start); d < 30*time.Millisecond {
		t.Fatalf("answered after %s, before the 30 ms latency", d)
	}
}

func TestSetFaults(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stripeemulator.Config{})
	if err := e.emu.SetFaults(stripeemulator.Faults{HTTP429: 3}); !errors.Is(err, stripeemulator.ErrInvalidFaults) {
		t.Fatalf("want ErrInvalidFaults, got %v", err)
	}
	if err := e.emu.SetFaults(stripeemulator.Faults{HTTP429: 1}); err != nil {
		t.Fatal(err)
	}
	_, err := e.sc.BillingMeterEvents.New(event("evt-f", custA, "1", epoch))
	if stripeErr(t, err).HTTPStatusCode != http.StatusTooManyRequests {
		t.Fatal("want 429 after SetFaults")
	}
	if err := e.emu.SetFaults(stripeemulator.Faults{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.sc.BillingMeterEvents.New(event("evt-f", custA, "1", epoch)); err != nil {
		t.Fatalf("want applied once faults are off, got %v", err)
	}
	if s := e.emu.Stats(); s.Faults != "" || s.Outcomes[stripeemulator.OutcomeRateLimited] != 1 {
		t.Fatalf("stats %+v", s)
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	t.Parallel()
	if _, err := stripeemulator.New(stripeemulator.Config{DedupeWindow: -time.Second}); !errors.Is(err, stripeemulator.ErrInvalidConfig) {
		t.Fatalf("want ErrInvalidConfig, got %v", err)
	}
	if _, err := stripeemulator.New(stripeemulator.Config{Faults: stripeemulator.Faults{HTTP500: 0.7, DropAfterApply: 0.7}}); !errors.Is(err, stripeemulator.ErrInvalidFaults) {
		t.Fatalf("want ErrInvalidFaults, got %v", err)
	}
}
