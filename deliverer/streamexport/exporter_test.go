package streamexport

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/deliverer"
	"github.com/aurora-billing/aurora/deliverer/stripeexport"
	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/aurora-billing/aurora/stripeemulator"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

const testKey = "sk_test_stream_1234"

func req(i int) deliverer.Request {
	return deliverer.Request{ItemID: int64(i), Account: "acct_1", Via: deliverer.ExporterStream, Key: fmt.Sprintf("%064d", i),
		EventName: "api_calls", CustomerKey: "stripe_customer_id", ValueKey: "value", Customer: "cus_A", Value: int64(i % 7),
		Timestamp: reqTime}
}

// reqTime is every test request's timestamp: fixed, so req(i) is a pure
// function of i.
var reqTime = time.Now().Add(-time.Minute).Truncate(time.Second)

// canned serves the session endpoint and answers the stream with h.
func canned(t *testing.T, h func(w http.ResponseWriter, r *http.Request, evs []Event)) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v2/billing/meter_event_session":
			now := time.Now().UTC()
			fmt.Fprintf(w, `{"object":"v2.billing.meter_event_session","authentication_token":"ek_test_tok","created":%q,"expires_at":%q}`,
				now.Format(time.RFC3339), now.Add(15*time.Minute).Format(time.RFC3339))
		case "/v2/billing/meter_event_stream":
			var b struct{ Events []Event }
			raw, _ := io.ReadAll(r.Body)
			_ = json.Unmarshal(raw, &b)
			h(w, r, b.Events)
		default:
			w.WriteHeader(404)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

func newExporter(t *testing.T, base string, timeout time.Duration, now func() time.Time, reg prometheus.Registerer) *Exporter {
	t.Helper()
	x, err := New(Config{Client: ClientConfig{APIKey: testKey, APIBase: base, Timeout: timeout, Now: now, Registerer: reg}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(x.Close)
	return x
}

func errBody(status int, typ, code string) func(w http.ResponseWriter, r *http.Request, evs []Event) {
	return func(w http.ResponseWriter, _ *http.Request, _ []Event) {
		w.Header().Set("Request-Id", "req_canned")
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"error":{"type":%q,"code":%q,"message":"canned"}}`, typ, code)
	}
}

// TestOutcomeTable answers every row of Rules from a canned server and
// checks what each item of a 3-event batch gets. Every rule must have a case.
func TestOutcomeTable(t *testing.T) {
	ok := func(w http.ResponseWriter, _ *http.Request, _ []Event) {
		w.Header().Set("Request-Id", "req_ok")
		io.WriteString(w, "{}")
	}
	cases := []struct {
		rule    string
		h       func(w http.ResponseWriter, r *http.Request, evs []Event)
		flaky   bool // first answer h, then 200
		outcome deliverer.Outcome
		reason  outbox.Reason
		calls   int // stream requests expected (0: don't check)
	}{
		{rule: "timeout", h: func(w http.ResponseWriter, r *http.Request, _ []Event) { <-r.Context().Done() }, outcome: deliverer.OutcomeRetry, calls: 1},
		{rule: "connection_error", h: func(w http.ResponseWriter, _ *http.Request, _ []Event) {
			c, _, _ := w.(http.Hijacker).Hijack()
			c.Close()
		}, outcome: deliverer.OutcomeRetry, calls: 1},
		{rule: "http_2xx", h: ok, outcome: deliverer.OutcomeAccepted, calls: 1},
		{rule: "session_expired", h: errBody(401, "temporary_session_expired", "billing_meter_event_session_expired"), flaky: true, outcome: deliverer.OutcomeAccepted, calls: 2},
		{rule: "session_expired", h: errBody(400, "temporary_session_expired", "billing_meter_event_session_expired"), flaky: true, outcome: deliverer.OutcomeAccepted, calls: 2},
		{rule: "session_expired", h: errBody(401, "temporary_session_expired", "billing_meter_event_session_expired"), outcome: deliverer.OutcomeRetry, calls: 3},
		{rule: "token_refused", h: errBody(401, "invalid_request_error", ""), flaky: true, outcome: deliverer.OutcomeAccepted, calls: 2},
		{rule: "token_refused", h: errBody(401, "invalid_request_error", ""), outcome: deliverer.OutcomeQuarantined, reason: outbox.ReasonAccountUnconfirmed, calls: 3},
		{rule: "rate_limited", h: errBody(429, "invalid_request_error", "rate_limit"), outcome: deliverer.OutcomeRetry, calls: 1},
		{rule: "conflict", h: errBody(409, "invalid_request_error", "idempotency_key_in_use"), outcome: deliverer.OutcomeRetry, calls: 1},
		{rule: "server_error", h: errBody(500, "api_error", ""), outcome: deliverer.OutcomeRetry, calls: 1},
		{rule: "server_error", h: func(w http.ResponseWriter, _ *http.Request, _ []Event) { w.WriteHeader(502) }, outcome: deliverer.OutcomeRetry, calls: 1},
		{rule: "forbidden", h: errBody(403, "invalid_request_error", ""), outcome: deliverer.OutcomeQuarantined, reason: outbox.ReasonAccountUnconfirmed, calls: 1},
		{rule: "endpoint_missing", h: errBody(404, "invalid_request_error", ""), outcome: deliverer.OutcomeRejected, calls: 1},
		// 3 events, every request refused: 1 + 2 + 2 (the halves of 1 and 2) = 5 requests, each event rejected alone.
		{rule: "request_invalid", h: errBody(400, "invalid_request_error", "parameter_invalid_string"), outcome: deliverer.OutcomeRejected, calls: 5},
		{rule: "request_invalid", h: errBody(413, "invalid_request_error", ""), outcome: deliverer.OutcomeRejected, calls: 5},
		{rule: "unexpected", h: func(w http.ResponseWriter, _ *http.Request, _ []Event) { w.WriteHeader(302) }, outcome: deliverer.OutcomeUncertain, calls: 1},
	}
	seen := map[string]bool{}
	for i, tc := range cases {
		seen[tc.rule] = true
		t.Run(fmt.Sprintf("%02d_%s", i, tc.rule), func(t *testing.T) {
			var calls atomic.Int32
			var ids sync.Map
			srv := canned(t, func(w http.ResponseWriter, r *http.Request, evs []Event) {
				n := calls.Add(1)
				for _, e := range evs {
					ids.Store(e.Identifier, true)
				}
				if tc.flaky && n > 1 {
					ok(w, r, evs)
					return
				}
				tc.h(w, r, evs)
			})
			x := newExporter(t, srv.URL, 300*time.Millisecond, nil, nil)
			// Three items queued before the senders run: one batch.
			x.senders = 1
			results := exportAll(t, x, 3, time.Second)
			for j, res := range results {
				if res.Outcome != tc.outcome || res.Reason != tc.reason || !strings.HasPrefix(res.Rule, "stream_") {
					t.Fatalf("item %d: %+v, want %s/%s", j, res, tc.outcome, tc.reason)
				}
			}
			if tc.calls > 0 && int(calls.Load()) != tc.calls {
				t.Fatalf("stream requests %d, want %d", calls.Load(), tc.calls)
			}
		})
	}
	for _, r := range Rules() {
		if !seen[r.Name] {
			t.Errorf("rule %s has no case", r.Name)
		}
	}
}

// exportAll exports n requests concurrently, queued before any sender
// takes one, and returns the results in order.
func exportAll(t *testing.T, x *Exporter, n int, timeout time.Duration) []deliverer.Result {
	t.Helper()
	// Fill the queue while the batcher is held: start it only after.
	q := make(chan *unit, n)
	x.mu.Lock()
	x.queues["acct_1"] = q
	x.mu.Unlock()
	out := make([]deliverer.Result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			out[i] = x.Export(ctx, req(i+1))
		}()
	}
	for len(q) < n {
		time.Sleep(time.Millisecond)
	}
	work := make(chan []*unit)
	x.wg.Add(1 + x.senders)
	go x.batcher(q, work)
	for range x.senders {
		go x.sender("acct_1", work)
	}
	wg.Wait()
	return out
}

// TestSplitFindsTheEventAtFault: a 400 for any request carrying one bad
// event; the other 99 are accepted, the bad one alone is classified.
func TestSplitFindsTheEventAtFault(t *testing.T) {
	bad := req(42).Key
	srv := canned(t, func(w http.ResponseWriter, r *http.Request, evs []Event) {
		for _, e := range evs {
			if e.Identifier == bad {
				errBody(400, "invalid_request_error", "timestamp_too_far_in_past")(w, r, evs)
				return
			}
		}
		io.WriteString(w, "{}")
	})
	x := newExporter(t, srv.URL, time.Second, nil, nil)
	x.senders = 1
	res := exportAll(t, x, 100, 5*time.Second)
	for i, r := range res {
		want := deliverer.OutcomeAccepted
		if i+1 == 42 {
			want = deliverer.OutcomeQuarantined
			if r.Reason != outbox.ReasonTimestampOutsideWindow {
				t.Fatalf("bad item: %+v", r)
			}
		}
		if r.Outcome != want {
			t.Fatalf("item %d: %+v, want %s", i+1, r, want)
		}
	}
}

func emulator(t *testing.T, cfg stripeemulator.Config) (*stripeemulator.Emulator, *httptest.Server) {
	t.Helper()
	emu, err := stripeemulator.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(emu)
	t.Cleanup(srv.Close)
	if err := emu.AddCustomer("cus_A"); err != nil {
		t.Fatal(err)
	}
	if _, err := emu.AddMeter(stripeemulator.MeterSpec{DisplayName: "API calls", EventName: "api_calls"}); err != nil {
		t.Fatal(err)
	}
	return emu, srv
}

// TestBatchesOnTheEmulator: 250 concurrent items become requests of at
// most 100 events; identifiers and payload values are exactly the v1
// exporter's; applied once each.
func TestBatchesOnTheEmulator(t *testing.T) {
	emu, srv := emulator(t, stripeemulator.Config{})
	x := newExporter(t, srv.URL, 5*time.Second, nil, nil)
	x.senders = 2
	res := exportAll(t, x, 250, 10*time.Second)
	for i, r := range res {
		if r.Outcome != deliverer.OutcomeAccepted || r.ProviderRef == "" {
			t.Fatalf("item %d: %+v", i+1, r)
		}
	}
	if n := emu.AppliedCount(); n != 250 {
		t.Fatalf("applied %d", n)
	}
	streams := 0
	for _, rr := range emu.Requests() {
		if rr.Route == stripeemulator.RouteMeterEventStream {
			streams++
			if len(rr.Identifiers) > MaxEvents {
				t.Fatalf("request of %d events", len(rr.Identifiers))
			}
		}
	}
	if streams < 3 || streams > 250/2 {
		t.Fatalf("%d stream requests for 250 events", streams)
	}
	byID := map[string]stripeemulator.AppliedEvent{}
	for _, ev := range emu.Applied() {
		byID[ev.Identifier] = ev
	}
	for i := 1; i <= 250; i++ {
		r := req(i)
		p := stripeexport.Params(context.Background(), r) // the v1 request of the same item
		ev := byID[*p.Identifier]
		if ev.Identifier != r.Key || ev.Customer != p.Payload["stripe_customer_id"] ||
			fmt.Sprint(ev.Value) != p.Payload["value"] || ev.Timestamp.Unix() != *p.Timestamp {
			t.Fatalf("item %d: applied %+v, v1 params %+v", i, ev, p)
		}
	}
}

type manual struct {
	mu sync.Mutex
	t  time.Time
}

func (m *manual) Now() time.Time { m.mu.Lock(); defer m.mu.Unlock(); return m.t }
func (m *manual) Add(d time.Duration) {
	m.mu.Lock()
	m.t = m.t.Add(d)
	m.mu.Unlock()
}

// TestSessionTokenLifecycle: created lazily, reused, refreshed before it
// expires (our clock), replaced after an expired answer (the emulator's
// clock) with the same batch resent under the same identifiers; every
// creation counted; the token never appears in a result.
func TestSessionTokenLifecycle(t *testing.T) {
	emuClock := &manual{t: time.Now()}
	ourClock := &manual{t: time.Now()}
	emu, srv := emulator(t, stripeemulator.Config{Now: emuClock.Now})
	reg := prometheus.NewRegistry()
	x := newExporter(t, srv.URL, 5*time.Second, ourClock.Now, reg)
	if emu.Sessions() != 0 {
		t.Fatal("session created before any export")
	}
	export := func(i int) deliverer.Result {
		r := req(i)
		r.Timestamp = emuClock.Now().Add(-time.Minute)
		return x.Export(context.Background(), r)
	}
	check := func(i, sessions int) {
		t.Helper()
		res := export(i)
		if res.Outcome != deliverer.OutcomeAccepted {
			t.Fatalf("item %d: %+v", i, res)
		}
		if b, _ := json.Marshal(res); strings.Contains(string(b), "ek_test_") {
			t.Fatalf("token in a result: %s", b)
		}
		if emu.Sessions() != sessions || x.Client().Refreshes() != int64(sessions) {
			t.Fatalf("after item %d: sessions %d (client %d), want %d", i, emu.Sessions(), x.Client().Refreshes(), sessions)
		}
		if got := testutil.ToFloat64(x.Client().refreshes); got != float64(sessions) {
			t.Fatalf("counter %v", got)
		}
	}
	check(1, 1)
	check(2, 1)
	ourClock.Add(13*time.Minute + 59*time.Second)
	emuClock.Add(13*time.Minute + 59*time.Second)
	check(3, 1)
	ourClock.Add(2 * time.Second) // within RefreshMargin of expiry: replaced before use
	emuClock.Add(2 * time.Second)
	check(4, 2)
	// The emulator's clock runs ahead: its expired answer, a new session,
	// the same event resent.
	emuClock.Add(20 * time.Minute)
	check(5, 3)
	rs := emu.RequestsFor(req(5).Key)
	if len(rs) != 2 || rs[0].Status != 401 || rs[1].Status != 200 || rs[0].BodySHA256 != rs[1].BodySHA256 {
		t.Fatalf("requests for item 5: %+v", rs)
	}
	if emu.AppliedCount() != 5 || len(emu.DuplicateApplications()) != 0 {
		t.Fatalf("applied %d dup %v", emu.AppliedCount(), emu.DuplicateApplications())
	}
	mfs, _ := reg.Gather()
	if len(mfs) != 1 || mfs[0].GetName() != "aurora_deliverer_stream_session_refreshes_total" {
		t.Fatalf("metrics %v", mfs)
	}
}

// TestDropAfterApplyResend: the batch applied but the answer lost; the
// resend (same identifiers) is answered 200 and applies nothing again.
func TestDropAfterApplyResend(t *testing.T) {
	emu, srv := emulator(t, stripeemulator.Config{})
	x := newExporter(t, srv.URL, 5*time.Second, nil, nil)
	emu.Script(req(1).Key, stripeemulator.Answer{Kind: stripeemulator.AnswerDropAfterApply})
	if r := x.Export(context.Background(), req(1)); r.Outcome != deliverer.OutcomeRetry || r.Rule != "stream_connection_error" {
		t.Fatalf("first: %+v", r)
	}
	if r := x.Export(context.Background(), req(1)); r.Outcome != deliverer.OutcomeAccepted {
		t.Fatalf("resend: %+v", r)
	}
	if emu.Applications(req(1).Key) != 1 || len(emu.DuplicateApplications()) != 0 {
		t.Fatal("applied twice")
	}
}

func TestRouter(t *testing.T) {
	var v1, st countExporter
	r := Router{V1: &v1, Stream: &st}
	a, b := req(1), req(2)
	a.Via, b.Via = deliverer.ExporterV1, deliverer.ExporterStream
	r.Export(context.Background(), a)
	r.Export(context.Background(), b)
	c := req(3)
	c.Via = ""
	r.Export(context.Background(), c)
	if v1.n.Load() != 2 || st.n.Load() != 1 {
		t.Fatalf("v1 %d stream %d", v1.n.Load(), st.n.Load())
	}
}

type countExporter struct{ n atomic.Int32 }

func (c *countExporter) Name() string            { return outbox.DefaultExporter }
func (c *countExporter) Mode() identityModeAlias { return "test" }
func (c *countExporter) Export(context.Context, deliverer.Request) deliverer.Result {
	c.n.Add(1)
	return deliverer.Result{Outcome: deliverer.OutcomeAccepted}
}

// TestDocsTable: docs/deliverer.md carries MarkdownTable verbatim.
func TestDocsTable(t *testing.T) {
	b, err := os.ReadFile("../../docs/deliverer.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), MarkdownTable()) {
		t.Fatalf("docs/deliverer.md lacks the stream outcome table; want:\n%s", MarkdownTable())
	}
}

type identityModeAlias = identity.Mode

// laneReqs returns n requests of one lane (customer cus), keys from first.
func laneReqs(cus string, first, n int) []deliverer.Request {
	rs := make([]deliverer.Request, n)
	for i := range rs {
		rs[i] = req(first + i)
		rs[i].Customer = cus
	}
	return rs
}

// exportGroups exports each group with ExportGroup concurrently, all
// queued before the batcher takes any, and returns the results per group.
func exportGroups(t *testing.T, x *Exporter, groups [][]deliverer.Request) [][]deliverer.Result {
	t.Helper()
	q := make(chan *unit, len(groups)+8)
	x.mu.Lock()
	x.queues["acct_1"] = q
	x.mu.Unlock()
	out := make([][]deliverer.Result, len(groups))
	var wg sync.WaitGroup
	for i, g := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			out[i] = x.ExportGroup(ctx, g)
		}()
	}
	// A group of more than maxBatch queues its next part only after the
	// first is answered: wait for the first parts only.
	for len(q) < len(groups) {
		time.Sleep(time.Millisecond)
	}
	work := make(chan []*unit)
	x.wg.Add(1 + x.senders)
	go x.batcher(q, work)
	for range x.senders {
		go x.sender("acct_1", work)
	}
	wg.Wait()
	return out
}

// TestBatchesPackWholeLanes: lanes' groups queued together go out in
// requests of up to 100 events packed from many lanes; a lane's group is
// never split across requests, and a lane of more than 100 goes in
// consecutive requests, never two at once (Stripe's one call at a time per
// customer and meter). Every item gets its own accepted result.
func TestBatchesPackWholeLanes(t *testing.T) {
	var mu sync.Mutex
	var reqs [][]Event
	inFlight := map[string]int{}
	overlap := false
	srv := canned(t, func(w http.ResponseWriter, _ *http.Request, evs []Event) {
		cus := map[string]bool{}
		for _, e := range evs {
			cus[e.Payload["stripe_customer_id"]] = true
		}
		mu.Lock()
		reqs = append(reqs, evs)
		for c := range cus {
			inFlight[c]++
			if inFlight[c] > 1 {
				overlap = true
			}
		}
		mu.Unlock()
		time.Sleep(2 * time.Millisecond) // let a concurrent request of a lane show
		mu.Lock()
		for c := range cus {
			inFlight[c]--
		}
		mu.Unlock()
		io.WriteString(w, "{}")
	})
	x := newExporter(t, srv.URL, 10*time.Second, nil, nil)
	x.senders = 4
	var groups [][]deliverer.Request
	next, total := 1, 0
	for i := range 60 { // 60 lanes of 1..9 items: 300 events
		n := i%9 + 1
		groups = append(groups, laneReqs(fmt.Sprintf("cus_L%02d", i), next, n))
		next += n
		total += n
	}
	groups = append(groups, laneReqs("cus_BIG", next, 230)) // one lane beyond 100
	total += 230
	res := exportGroups(t, x, groups)
	for gi, g := range res {
		if len(g) != len(groups[gi]) {
			t.Fatalf("group %d: %d results for %d requests", gi, len(g), len(groups[gi]))
		}
		for i, r := range g {
			if r.Outcome != deliverer.OutcomeAccepted {
				t.Fatalf("group %d item %d: %+v", gi, i, r)
			}
		}
	}
	if overlap {
		t.Fatal("a lane had two requests in flight at once")
	}
	where := map[string]int{} // customer -> request index (small lanes)
	events, big := 0, 0
	for ri, evs := range reqs {
		if len(evs) > MaxEvents {
			t.Fatalf("request %d has %d events", ri, len(evs))
		}
		events += len(evs)
		for _, e := range evs {
			c := e.Payload["stripe_customer_id"]
			if c == "cus_BIG" {
				continue
			}
			if at, ok := where[c]; ok && at != ri {
				t.Fatalf("lane %s split across requests %d and %d", c, at, ri)
			}
			where[c] = ri
		}
		for _, e := range evs {
			if e.Payload["stripe_customer_id"] == "cus_BIG" {
				big++
			}
		}
	}
	if events != total || big != 230 {
		t.Fatalf("%d events sent (%d of the big lane), want %d (230)", events, big, total)
	}
	// 530 events, whole lanes: at least 6 requests; packed, not one per
	// lane (61 lanes, the big one in 3 parts).
	if len(reqs) < 6 || len(reqs) > 12 {
		t.Fatalf("%d requests for %d events of 61 lanes", len(reqs), total)
	}
}

// TestLingerRange: Linger beyond MaxLinger or negative is refused; 0 is
// the default.
func TestLingerRange(t *testing.T) {
	for _, tc := range []struct {
		linger time.Duration
		ok     bool
	}{{0, true}, {time.Millisecond, true}, {MaxLinger, true}, {-time.Millisecond, false}, {MaxLinger + time.Millisecond, false}} {
		x, err := New(Config{Client: ClientConfig{APIKey: testKey, APIBase: "http://127.0.0.1:1", Timeout: time.Second}, Linger: tc.linger})
		if (err == nil) != tc.ok {
			t.Fatalf("linger %s: err %v", tc.linger, err)
		}
		if err != nil {
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "linger") {
				t.Fatalf("linger %s: %v", tc.linger, err)
			}
			continue
		}
		if tc.linger == 0 && x.linger != DefaultLinger {
			t.Fatalf("default linger %s", x.linger)
		}
		x.Close()
	}
}
