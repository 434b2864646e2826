package deliverer_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/deliverer"
	"github.com/aurora-billing/aurora/deliverer/stripeexport"
	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/aurora-billing/aurora/stripeemulator"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// TestDeliverAccepted: pending → leased → accepted with one attempt row,
// provider_ref = Stripe's request id, the event applied once.
func TestDeliverAccepted(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stripeemulator.Faults{})
	h.start(testConfig())
	row := h.stage(h.item("org_1", "event:e1", 7))
	h.publish(row.ID)
	got := h.awaitState(row.ID, outbox.StateAccepted)
	if got.ProviderRef == nil || len(*got.ProviderRef) < 4 || (*got.ProviderRef)[:4] != "req_" {
		t.Fatalf("provider_ref %v", got.ProviderRef)
	}
	if got.Attempts != 1 || got.LeaseToken != 1 || got.LeaseExpiresAt != nil || got.FirstAttemptAt == nil {
		t.Fatalf("row %+v", got)
	}
	as := h.attempts(row.ID)
	if len(as) != 1 || *as[0].Outcome != "accepted" || *as[0].HTTPStatus != 200 || as[0].RequestID == nil || !as[0].Finished {
		t.Fatalf("attempts %+v", as)
	}
	if h.emu.Applications(row.IdempotencyKey) != 1 {
		t.Fatal("not applied once")
	}
	ev := h.emu.Applied()[0]
	if ev.Identifier != row.IdempotencyKey || ev.Value != 7 || ev.Customer != customer || !ev.Timestamp.Equal(row.OccurredAt.Truncate(time.Second)) {
		t.Fatalf("applied %+v", ev)
	}
	// A duplicate message of the same dispatch is acknowledged without a call.
	h.exec(`SELECT 1`)
	before := len(h.emu.Requests())
	h.publishDuplicateGeneration(row.ID)
	time.Sleep(0) // nothing to wait for: the assertion below polls
	h.await("duplicate message consumed", func() bool { return h.pending() == 0 })
	if len(h.emu.Requests()) != before || h.get(row.ID).State != outbox.StateAccepted {
		t.Fatal("a message for a terminal item reached the provider")
	}
}

// TestPreSendQuarantine: leased → quarantined for every pre-send check,
// nothing sent.
func TestPreSendQuarantine(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stripeemulator.Faults{})
	h.exec(`INSERT INTO stripe_accounts (account_id, mode, confirmed) VALUES ('acct_unconfirmed', 'test', false), ('acct_live', 'live', true)`)
	h.exec(`INSERT INTO tenant_billing (tenant, destination_account, stripe_customer) VALUES ('org_nocus', $1, NULL)`, acct)
	// A tenant's own watermark wins over the default ('') one.
	h.addTenant("org_buf", "cus_buf")
	h.exec(`INSERT INTO usage_cutovers (tenant, feature, watermark, scheduled_by) VALUES ('', $1, $2, 'test'), ('org_buf', $1, $3, 'test')`,
		"api_calls", h.clk.Now().Add(-60*24*time.Hour), h.clk.Now().Add(-48*time.Hour))
	h.exec(`INSERT INTO meter_mappings (destination_account, feature, meter_id, event_name) VALUES ($1, 'other', 'mtr_x', 'other')`, acct)
	h.exec(`UPDATE meter_mappings SET mapping_version = 2 WHERE feature = 'other'`)

	mk := func(ref string, f func(*outbox.Item)) outbox.Item {
		it := h.item("org_1", ref, 1)
		f(&it)
		return it
	}
	cases := []struct {
		it     outbox.Item
		reason outbox.Reason
	}{
		{mk("unknown-acct", func(i *outbox.Item) { i.DestinationAccount = "acct_missing" }), outbox.ReasonAccountUnconfirmed},
		{mk("unconfirmed", func(i *outbox.Item) { i.DestinationAccount = "acct_unconfirmed" }), outbox.ReasonAccountUnconfirmed},
		{mk("acct-mode", func(i *outbox.Item) { i.DestinationAccount = "acct_live"; i.Mode = identity.ModeTest }), outbox.ReasonModeMismatch},
		{mk("key-mode", func(i *outbox.Item) { i.DestinationAccount = "acct_live"; i.Mode = identity.ModeLive }), outbox.ReasonModeMismatch},
		{mk("unmapped", func(i *outbox.Item) { i.Feature = "storage" }), outbox.ReasonFeatureUnmapped},
		{mk("v0", func(i *outbox.Item) { i.MappingVersion = 0 }), outbox.ReasonFeatureUnmapped},
		{mk("old-version", func(i *outbox.Item) { i.Feature = "other"; i.MappingVersion = 1 }), outbox.ReasonFeatureUnmapped},
		{mk("no-billing", func(i *outbox.Item) { i.Tenant = "org_unknown" }), outbox.ReasonCustomerMissing},
		{mk("null-customer", func(i *outbox.Item) { i.Tenant = "org_nocus" }), outbox.ReasonCustomerMissing},
		{mk("buffered", func(i *outbox.Item) { i.Tenant = "org_buf"; i.PeriodStart = h.clk.Now().Add(-72 * time.Hour) }), outbox.ReasonPeriodBuffered},
		{mk("window-after-watermark", func(i *outbox.Item) {
			i.Tenant = "org_buf"
			i.SubjectKind = identity.SubjectUsageWindow
			i.PeriodStart = h.clk.Now().Add(-72 * time.Hour)
			i.OccurredAt = h.clk.Now().Add(10 * time.Minute)
		}), outbox.ReasonTimestampOutsideWindow},
		{mk("old", func(i *outbox.Item) { i.OccurredAt = h.clk.Now().Add(-36 * 24 * time.Hour) }), outbox.ReasonTimestampOutsideWindow},
		{mk("future", func(i *outbox.Item) { i.OccurredAt = h.clk.Now().Add(6 * time.Minute) }), outbox.ReasonTimestampOutsideWindow},
		{mk("negative", func(i *outbox.Item) { i.SubjectKind = identity.SubjectCorrection; i.Quantity = -3 }), outbox.ReasonNegativeQuantity},
	}
	h.start(testConfig())
	var ids []int64
	for _, c := range cases {
		row := h.stage(c.it)
		ids = append(ids, row.ID)
		h.publish(row.ID)
	}
	for i, c := range cases {
		row := h.awaitState(ids[i], outbox.StateQuarantined)
		if row.QuarantineReason == nil || *row.QuarantineReason != c.reason || row.LastError == nil {
			t.Errorf("%s: reason %v last_error %v, want %s", c.it.SubjectRef, deref((*string)(row.QuarantineReason)), deref(row.LastError), c.reason)
		}
		if as := h.attempts(ids[i]); len(as) != 1 || *as[0].Outcome != "quarantined" || as[0].HTTPStatus != nil {
			t.Errorf("%s: attempts %v", c.it.SubjectRef, outcomes(as))
		}
	}
	if n := len(h.emu.Requests()); n != 0 {
		t.Fatalf("%d requests reached the provider", n)
	}
}

// TestClassificationOutcomes: the emulator answers each scripted way; the
// item lands in the state the classification table says (every row of the
// table is tested against canned answers in stripeexport; this runs the
// whole path on the emulator).
func TestClassificationOutcomes(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stripeemulator.Faults{})
	cases := []struct {
		answer string
		state  outbox.State
		reason outbox.Reason
	}{
		{"ok", outbox.StateAccepted, ""},
		{"500", outbox.StatePending, ""},
		{"500-saved", outbox.StatePending, ""},
		{"429", outbox.StatePending, ""},
		{"409", outbox.StatePending, ""},
		{"drop", outbox.StatePending, ""},
		{"drop-after-apply", outbox.StatePending, ""},
		{"timeout", outbox.StatePending, ""},
		{"401", outbox.StateQuarantined, outbox.ReasonAccountUnconfirmed},
		{"403", outbox.StateQuarantined, outbox.ReasonAccountUnconfirmed},
		{"400:no_meter", outbox.StateQuarantined, outbox.ReasonProviderConfiguration},
		{"400:meter_event_customer_not_found", outbox.StateQuarantined, outbox.ReasonCustomerMissing},
		{"400:timestamp_too_far_in_past", outbox.StateQuarantined, outbox.ReasonTimestampOutsideWindow},
		{"400:parameter_invalid_string", outbox.StateRejected, ""},
	}
	h.start(testConfig(), deliverer.WithProviderTimeout(500*time.Millisecond))
	ids := make([]int64, len(cases))
	for i, c := range cases {
		tenant := fmt.Sprintf("org_c%d", i) // one customer each: no slot contention
		h.addTenant(tenant, "cus_c"+fmt.Sprint(i))
		row := h.stage(h.item(tenant, "event:"+c.answer, 1))
		a, err := stripeemulator.ParseAnswer(c.answer)
		if err != nil {
			t.Fatal(err)
		}
		h.emu.Script(row.IdempotencyKey, a)
		ids[i] = row.ID
		h.publish(row.ID)
	}
	for i, c := range cases {
		var row outbox.Row
		h.await(c.answer, func() bool {
			row = h.get(ids[i])
			return row.State != outbox.StateLeased && row.Attempts == 1 && row.State != outbox.StatePending || (row.State == outbox.StatePending && row.Dispatch == 2)
		})
		got := outbox.Reason("")
		if row.QuarantineReason != nil {
			got = *row.QuarantineReason
		}
		if row.State != c.state || got != c.reason {
			t.Errorf("%s: state %s reason %q, want %s %q (last_error %v)", c.answer, row.State, got, c.state, c.reason, deref(row.LastError))
		}
		if c.state == outbox.StatePending {
			// retry: dispatch+1 for the relay, backoff within [base/2, base] on the manual clock
			delay := row.NextAttemptAt.Sub(h.clk.Now())
			if row.Dispatch != 2 || delay < 2500*time.Millisecond || delay > 5*time.Second || row.LeaseExpiresAt != nil {
				t.Errorf("%s: retry row dispatch %d delay %s", c.answer, row.Dispatch, delay)
			}
		}
	}
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

// TestIdempotencyErrorIsUncertain: the same key with different parameters
// (here: Stripe already saw this key with another value) → uncertain.
func TestIdempotencyErrorIsUncertain(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stripeemulator.Faults{})
	row := h.stage(h.item("org_1", "event:idem", 5))
	// Someone used the key with other parameters first (a bug elsewhere).
	other := deliverer.Request{Key: row.IdempotencyKey, EventName: feature, CustomerKey: "stripe_customer_id", ValueKey: "value",
		Customer: customer, Value: 6, Timestamp: row.OccurredAt}
	exp, err := stripeexport.New(stripeexport.Config{APIKey: testKey, APIBase: h.srv.URL}, 5*time.Second, 1)
	if err != nil {
		t.Fatal(err)
	}
	if res := exp.Export(context.Background(), other); res.Outcome != deliverer.OutcomeAccepted {
		t.Fatalf("setup: %+v", res)
	}
	h.start(testConfig())
	h.publish(row.ID)
	got := h.awaitState(row.ID, outbox.StateUncertain)
	if as := h.attempts(row.ID); len(as) != 1 || *as[0].HTTPStatus != 400 {
		t.Fatalf("attempts %+v", as)
	}
	if got.LastError == nil {
		t.Fatal("no last_error")
	}
}

// TestLaneGroup: messages of one customer that queue while its first call
// runs are handled as one group (one claim, calls one at
// a time, one outcome statement); a later item of a group whose call could
// outlast the lease is not sent but recorded as a retry due at once.
func TestLaneGroup(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stripeemulator.Faults{})
	h.addTenant("org_g", "cus_g")
	var rows []outbox.Row
	for i := range 3 {
		rows = append(rows, h.stage(h.item("org_g", fmt.Sprintf("event:g%d", i), int64(i+1))))
		h.publish(rows[i].ID)
	}
	// Hold the first call until the other two messages have queued behind
	// it in the lane.
	var once sync.Once
	h.setGate(func(*http.Request) { once.Do(func() { time.Sleep(300 * time.Millisecond) }) })
	// A provider timeout longer than the lease: only a group's first item
	// may be sent.
	h.start(testConfig(), deliverer.WithLease(2*time.Second), deliverer.WithProviderTimeout(5*time.Second))
	h.awaitState(rows[0].ID, outbox.StateAccepted)
	h.awaitState(rows[1].ID, outbox.StateAccepted)
	h.await("third item recorded as not sent", func() bool {
		r := h.get(rows[2].ID)
		return r.State == outbox.StatePending && r.Dispatch == 2
	})
	third := h.get(rows[2].ID)
	if third.LastError == nil || !strings.HasPrefix(*third.LastError, "lease_budget") {
		t.Fatalf("third item's last_error %v, want lease_budget", third.LastError)
	}
	if as := h.attempts(rows[2].ID); len(as) != 1 || *as[0].Outcome != "retry" || as[0].HTTPStatus != nil {
		t.Fatalf("third item's attempts %+v, want one retry without a call", as)
	}
	if n := len(h.emu.Applied()); n != 2 || h.emu.Overlaps() != 0 {
		t.Fatalf("applied %d, overlaps %d; want 2 and 0", n, h.emu.Overlaps())
	}
}

// TestStartsWhileNATSDown: a deliverer started while NATS is down waits
// for it (longer than one JetStream request timeout) instead of exiting,
// then delivers what was published before the outage.
func TestStartsWhileNATSDown(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stripeemulator.Faults{})
	row := h.stage(h.item("org_1", "event:down", 3))
	h.publish(row.ID)
	h.nats.Stop()
	started := make(chan *running, 1)
	go func() { started <- h.start(testConfig()) }()
	time.Sleep(6 * time.Second) // past the 5 s request timeout that used to end Run
	h.nats.Restart()
	var r *running
	select {
	case r = <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("the deliverer did not start consuming after NATS came back")
	}
	h.awaitState(row.ID, outbox.StateAccepted)
	select {
	case <-r.done:
		t.Fatalf("deliverer stopped: %v", r.err)
	default:
	}
}

// skipped reads aurora_deliverer_messages_skipped_total{why}.
func skipped(reg *prometheus.Registry, why string) float64 {
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != "aurora_deliverer_messages_skipped_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "why" && l.GetValue() == why {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// counter reads an unlabelled counter from reg (0 when absent).
func counter(reg *prometheus.Registry, name string) float64 {
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

// TestBatchMessageDelivered: a batch message (several items of one
// partition in one JetStream message) is delivered item by item: every
// item accepted and applied once, a bad entry set aside and counted, and
// the message acknowledged once every item settled. A batch that comes
// again with one of them and a new item delivers only the new one.
func TestBatchMessageDelivered(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stripeemulator.Faults{})
	r := h.start(testConfig())
	var rows []outbox.Row
	var b outbox.Batch
	var subject string
	for i := range 4 {
		row := h.stage(h.item("org_1", fmt.Sprintf("event:batch%d", i), int64(i+1)))
		rows = append(rows, row)
		s, m := laneMessage(t, h.pool, row)
		subject = s
		b.Items = append(b.Items, outbox.BatchEntry{Subject: s, Message: m})
	}
	b.Items = append(b.Items, outbox.BatchEntry{Subject: subject, Message: outbox.Message{ItemID: 1, Key: "not-a-key", Dispatch: 1}})
	publishBatch := func(b outbox.Batch) {
		t.Helper()
		msg := &nats.Msg{Subject: subject, Data: b.Encode(), Header: nats.Header{outbox.HeaderBatch: []string{fmt.Sprint(len(b.Items))}}}
		msg.Header.Set(jetstream.MsgIDHeader, outbox.BatchMsgID(b))
		if _, err := h.js.PublishMsg(context.Background(), msg); err != nil {
			t.Fatal(err)
		}
	}
	publishBatch(b)
	for _, row := range rows {
		h.awaitState(row.ID, outbox.StateAccepted)
	}
	h.await("batch message acknowledged", func() bool { return h.pending() == 0 })
	for _, row := range rows {
		if n := h.emu.Applications(row.IdempotencyKey); n != 1 {
			t.Fatalf("item %d applied %d times", row.ID, n)
		}
	}
	if got := skipped(r.reg, "bad_message"); got != 1 {
		t.Fatalf("bad entries counted as skipped: %v, want 1", got)
	}

	// Again: an item already accepted and a new one.
	fresh := h.stage(h.item("org_1", "event:batch-new", 9))
	_, m := laneMessage(t, h.pool, fresh)
	requests := len(h.emu.Requests())
	publishBatch(outbox.Batch{Items: []outbox.BatchEntry{b.Items[0], {Subject: subject, Message: m}}})
	h.awaitState(fresh.ID, outbox.StateAccepted)
	h.await("second batch acknowledged", func() bool { return h.pending() == 0 })
	if h.emu.Applications(rows[0].IdempotencyKey) != 1 || h.emu.Applications(fresh.IdempotencyKey) != 1 {
		t.Fatal("an item was applied twice, or the new one not at all")
	}
	if got := len(h.emu.Requests()) - requests; got != 1 {
		t.Fatalf("%d provider requests for the second batch, want 1 (the new item)", got)
	}
}
