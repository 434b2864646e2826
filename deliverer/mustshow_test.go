package deliverer_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/deliverer"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/aurora-billing/aurora/stripeemulator"
)

func mustAnswer(t *testing.T, s string) stripeemulator.Answer {
	t.Helper()
	a, err := stripeemulator.ParseAnswer(s)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// sameWire checks that every request the emulator saw for key carried key
// as identifier and Idempotency-Key and the same body bytes.
func sameWire(t *testing.T, h *harness, key string, wantRequests int) {
	t.Helper()
	reqs := h.emu.RequestsFor(key)
	if len(reqs) != wantRequests {
		t.Fatalf("%d requests for the key, want %d", len(reqs), wantRequests)
	}
	for _, r := range reqs {
		if r.Identifier != key || r.IdempotencyKey != key || r.BodySHA256 != reqs[0].BodySHA256 {
			t.Fatalf("request %d: identifier %q key %q body differs %v", r.Seq, r.Identifier, r.IdempotencyKey, r.BodySHA256 != reqs[0].BodySHA256)
		}
	}
}

// Must show: drop-after-apply. The emulator applies the event and drops
// the connection; the deliverer retries with the same key and a
// byte-identical body; exactly one applied event.
func TestMustShowDropAfterApply(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stripeemulator.Faults{})
	h.start(testConfig())
	row := h.stage(h.item("org_1", "event:drop", 3))
	h.emu.Script(row.IdempotencyKey, mustAnswer(t, "drop-after-apply"))
	h.publish(row.ID)
	h.await("retry recorded", func() bool { r := h.get(row.ID); return r.State == outbox.StatePending && r.Dispatch == 2 })
	if h.emu.Applications(row.IdempotencyKey) != 1 {
		t.Fatal("drop-after-apply did not apply")
	}
	r := h.get(row.ID)
	h.clk.Set(r.NextAttemptAt) // the backoff passes on the manual clock, not in real time
	h.publish(row.ID)          // dispatch 2, as the relay publishes it once due
	h.awaitState(row.ID, outbox.StateAccepted)
	sameWire(t, h, row.IdempotencyKey, 2)
	if n := h.emu.Applications(row.IdempotencyKey); n != 1 || len(h.emu.DuplicateApplications()) != 0 {
		t.Fatalf("applied %d times", n)
	}
	if got := outcomes(h.attempts(row.ID)); fmt.Sprint(got) != "[retry accepted]" {
		t.Fatalf("attempts %v", got)
	}
}

// Must show: a take-over while the old owner is still in a call. The
// first deliverer owns the lane's partition and is inside a 3 s provider
// call when it stops pulling (it is stopping; its call goes on); its lease
// expires (manual clock); JetStream pins the partition to the second
// deliverer, which reclaims the item with a new token and calls while the
// first call is still open: Stripe answers 429 (one concurrent call per
// customer and meter), recorded as a retry. The first call then lands; its
// late write is refused by the lease_token fence; the retry is answered as
// an idempotent replay. Applied once, same identifier on every call.
func TestMustShowTakeOverWhileOldOwnerInCall(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stripeemulator.Faults{Latency: 3 * time.Second})
	row := h.stage(h.item("org_1", "event:slow", 4))
	lease := 30 * time.Second
	ttl := deliverer.WithPinnedTTL(300 * time.Millisecond)
	d1 := h.start(testConfig(), deliverer.WithLease(lease), ttl)
	inCall := make(chan struct{}, 4)
	h.setGate(func(*http.Request) {
		select {
		case inCall <- struct{}{}:
		default:
		}
	})
	h.publish(row.ID)
	<-inCall    // the first call reached the emulator and waits out its latency there
	d1.cancel() // stops pulling; the call goes on (shutdown timeout 10 s)

	h.clk.Advance(lease + time.Second)
	d2 := h.start(testConfig(), deliverer.WithLease(lease), ttl, deliverer.WithJitter(func() float64 { return 0 }))
	h.redispatch(row.ID)
	h.await("the second owner's overlapping call answered 429 and recorded as a retry", func() bool {
		r := h.get(row.ID)
		return r.State == outbox.StatePending && r.LeaseToken == 2
	})
	if n := h.emu.Overlaps(); n != 1 {
		t.Fatalf("overlaps %d, want 1", n)
	}
	<-d1.done // the first call ended; its write was refused
	if d1.stale() != 1 {
		t.Fatalf("first owner's stale writes %v, want 1", d1.stale())
	}
	if n := h.emu.Applications(row.IdempotencyKey); n != 1 {
		t.Fatalf("applied %d times after the first call", n)
	}
	h.clk.Advance(time.Minute) // past the retry's backoff
	h.redispatch(row.ID)
	final := h.awaitState(row.ID, outbox.StateAccepted)
	if final.LeaseToken != 3 {
		t.Fatalf("accepted with token %d, want 3", final.LeaseToken)
	}
	if got := outcomes(h.attempts(row.ID)); fmt.Sprint(got) != "[stale_lease retry accepted]" {
		t.Fatalf("attempt outcomes by token: %v", got)
	}
	if n := h.emu.Applications(row.IdempotencyKey); n != 1 {
		t.Fatalf("applied %d times", n)
	}
	sameWire(t, h, row.IdempotencyKey, 3)
	_ = d2
}

// Must show: with the normal lease and InProgress heartbeats, a provider
// slower than AckWait causes zero redeliveries.
func TestMustShowHeartbeatsNoRedelivery(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stripeemulator.Faults{Latency: 1500 * time.Millisecond})
	// AckWait 500 ms (heartbeat every ~167 ms) against 1.5 s calls: without
	// heartbeats JetStream would redeliver each message twice mid-call.
	r := h.start(testConfig(), deliverer.WithAckWait(500*time.Millisecond))
	var ids []int64
	for i := range 3 {
		tenant := fmt.Sprintf("org_hb%d", i)
		h.addTenant(tenant, "cus_hb"+fmt.Sprint(i))
		row := h.stage(h.item(tenant, "event:hb", 1))
		ids = append(ids, row.ID)
		h.publish(row.ID)
	}
	for _, id := range ids {
		h.awaitState(id, outbox.StateAccepted)
	}
	redelivered, delivered := h.consumerTotals(r)
	if redelivered != 0 || delivered < 3 {
		t.Fatalf("redelivered %d, delivered %d", redelivered, delivered)
	}
	if n := len(h.emu.Requests()); n != 3 {
		t.Fatalf("%d provider calls", n)
	}
	_ = r
}

// Must show: two deliverers, 20 items for one customer and meter, emulator
// latency 20 ms: zero overlapping calls for the pair, all applied once.
func TestMustShowNoOverlapOneCustomerMeter(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stripeemulator.Faults{Latency: 20 * time.Millisecond})
	cfg := testConfig()
	cfg.Concurrency = 16
	h.start(cfg)
	h.start(cfg)
	var ids []int64
	for i := range 20 {
		row := h.stage(h.item("org_1", fmt.Sprintf("event:o%d", i), 1))
		ids = append(ids, row.ID)
		h.publish(row.ID)
	}
	for _, id := range ids {
		h.awaitState(id, outbox.StateAccepted)
	}
	if o := h.emu.Overlaps(); o != 0 {
		t.Fatalf("%d overlapping calls", o)
	}
	if len(h.emu.Applied()) != 20 || len(h.emu.DuplicateApplications()) != 0 {
		t.Fatalf("applied %d", len(h.emu.Applied()))
	}
}

// Must show: items A, B, C; the emulator answers 500 to B's first attempt;
// the deliverer restarts (new process, JetStream restarted too): exactly
// three applied events, B's identifier and body unchanged across the
// restart; a resend of A gets Stripe's duplicate answer and A stays accepted.
func TestMustShowABCRestart(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stripeemulator.Faults{})
	a := h.stage(h.item("org_1", "event:A", 1))
	b := h.stage(h.item("org_1", "event:B", 2))
	c := h.stage(h.item("org_1", "event:C", 3))
	h.emu.Script(b.IdempotencyKey, mustAnswer(t, "500"))
	d1 := h.start(testConfig())
	for _, r := range []outbox.Row{a, b, c} {
		h.publish(r.ID)
	}
	h.awaitState(a.ID, outbox.StateAccepted)
	h.awaitState(c.ID, outbox.StateAccepted)
	h.await("B retry", func() bool { r := h.get(b.ID); return r.State == outbox.StatePending && r.Dispatch == 2 })

	d1.stop(t)
	h.nats.Restart()
	h.clk.Set(h.get(b.ID).NextAttemptAt)
	h.start(testConfig())
	h.publish(b.ID)
	h.awaitState(b.ID, outbox.StateAccepted)
	if n := len(h.emu.Applied()); n != 3 || len(h.emu.DuplicateApplications()) != 0 {
		t.Fatalf("applied %d events", n)
	}
	sameWire(t, h, b.IdempotencyKey, 2)

	// Resend A (e.g. a deliverer that died before recording it), after
	// Stripe forgot the idempotency key but not the identifier.
	h.emu.ForgetIdempotencyKeys()
	res := d1.exp.Export(context.Background(), requestFor(h, a))
	if res.Rule != "duplicate_identifier" || res.Outcome != deliverer.OutcomeAccepted {
		t.Fatalf("resend of A: %+v", res)
	}
	// And a new message for A reaches the deliverer: acked, no call, A stays.
	before := len(h.emu.Requests())
	h.publishDuplicateGeneration(a.ID)
	h.await("message for A consumed", func() bool { return h.pending() == 0 })
	if got := h.get(a.ID); got.State != outbox.StateAccepted || got.Attempts != 1 || len(h.emu.Requests()) != before {
		t.Fatalf("A moved: %+v", got)
	}
	if n := len(h.emu.Applied()); n != 3 {
		t.Fatalf("applied %d events after the resend", n)
	}
}

// requestFor builds the request the deliverer sends for row.
func requestFor(h *harness, row outbox.Row) deliverer.Request {
	return deliverer.Request{ItemID: row.ID, Key: row.IdempotencyKey, EventName: feature, CustomerKey: "stripe_customer_id",
		ValueKey: "value", Customer: customer, Value: row.Quantity, Timestamp: row.OccurredAt}
}

// Retry exhaustion: attempts reaching the maximum → uncertain, not
// rejected; a retry past the horizon → uncertain without sending.
func TestRetryLimits(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stripeemulator.Faults{})
	cfg := testConfig()
	cfg.MaxAttempts = 2
	h.start(cfg)

	ex := h.stage(h.item("org_1", "event:exhaust", 1))
	h.emu.Script(ex.IdempotencyKey, mustAnswer(t, "500"), mustAnswer(t, "429"))
	h.publish(ex.ID)
	h.await("first retry", func() bool { return h.get(ex.ID).Dispatch == 2 })
	h.clk.Set(h.get(ex.ID).NextAttemptAt)
	h.publish(ex.ID)
	got := h.awaitState(ex.ID, outbox.StateUncertain)
	if got.Attempts != 2 || got.LastError == nil || len(h.emu.RequestsFor(ex.IdempotencyKey)) != 2 {
		t.Fatalf("exhausted: %+v %s", got, deref(got.LastError))
	}

	hz := h.stage(h.item("org_1", "event:horizon", 1))
	h.emu.Script(hz.IdempotencyKey, mustAnswer(t, "500"))
	h.publish(hz.ID)
	h.await("horizon retry", func() bool { return h.get(hz.ID).Dispatch == 2 })
	h.clk.Advance(time.Duration(cfg.UncertaintyHorizonSeconds+1) * time.Second)
	h.publish(hz.ID)
	got = h.awaitState(hz.ID, outbox.StateUncertain)
	if n := len(h.emu.RequestsFor(hz.IdempotencyKey)); n != 1 {
		t.Fatalf("horizon: %d calls, want 1 (no send past the horizon)", n)
	}
	if got.LastError == nil || (*got.LastError)[:16] != "horizon_exceeded" {
		t.Fatalf("last_error %s", deref(got.LastError))
	}
}
