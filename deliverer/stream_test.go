package deliverer_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/deliverer"
	"github.com/aurora-billing/aurora/deliverer/streamexport"
	"github.com/aurora-billing/aurora/deliverer/stripeexport"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/aurora-billing/aurora/stripeemulator"
	"github.com/prometheus/client_golang/prometheus"
)

// startExp runs a deliverer with exp (a new process) and waits until its
// partitions are attached.
func (h *harness) startExp(cfg deliverer.Config, exp deliverer.Exporter, opts ...deliverer.Option) *running {
	h.t.Helper()
	reg := prometheus.NewRegistry()
	base := []deliverer.Option{deliverer.WithClock(h.clk), deliverer.WithLogger(quietLogger()), deliverer.WithRegisterer(reg)}
	d, err := deliverer.New(h.pool, h.js, exp, cfg, append(base, opts...)...)
	if err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{d: d, reg: reg, cancel: cancel, done: make(chan struct{})}
	go func() { r.err = d.Run(ctx); close(r.done) }()
	h.t.Cleanup(func() {
		cancel()
		<-r.done
	})
	h.await("partition consumers attached", func() bool {
		select {
		case <-r.done:
			return true
		default:
		}
		return d.Ready() == nil
	})
	return r
}

// streamRouter is what `aurora deliverer` runs: v1 and the stream, chosen
// by the account's column.
func (h *harness) streamRouter() (streamexport.Router, *streamexport.Exporter) {
	h.t.Helper()
	v1, err := stripeexport.New(stripeexport.Config{APIKey: testKey, APIBase: h.srv.URL}, 10*time.Second, 8)
	if err != nil {
		h.t.Fatal(err)
	}
	st, err := streamexport.New(streamexport.Config{Client: streamexport.ClientConfig{APIKey: testKey, APIBase: h.srv.URL, Timeout: 10 * time.Second}})
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(st.Close)
	return streamexport.Router{V1: v1, Stream: st}, st
}

// TestStreamAccountDeliversInBatches: an account set to the stream has its
// items of many lanes sent in requests of many events, each applied once;
// switching the account back to v1 sends the next items with v1.
func TestStreamAccountDeliversInBatches(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stripeemulator.Faults{})
	h.exec(`UPDATE stripe_accounts SET exporter = 'stream' WHERE account_id = $1`, acct)
	for i := range 20 {
		cus := fmt.Sprintf("cus_S%02d", i)
		if err := h.emu.AddCustomer(cus); err != nil {
			t.Fatal(err)
		}
		h.addTenant(fmt.Sprintf("org_s%02d", i), cus)
	}
	var rows []outbox.Row
	for i := range 200 {
		rows = append(rows, h.stage(h.item(fmt.Sprintf("org_s%02d", i%20), fmt.Sprintf("event:s%03d", i), int64(i%5+1))))
	}
	for _, r := range rows { // queued before the deliverer starts: lanes form groups
		h.publish(r.ID)
	}
	exp, st := h.streamRouter()
	h.startExp(testConfig(), exp)
	for _, r := range rows {
		h.awaitState(r.ID, outbox.StateAccepted)
	}
	stream, v1 := 0, 0
	for _, rr := range h.emu.Requests() {
		switch rr.Route {
		case stripeemulator.RouteMeterEventStream:
			stream++
		case stripeemulator.RouteMeterEventCreate:
			v1++
		}
	}
	if v1 != 0 || stream == 0 || stream >= len(rows) {
		t.Fatalf("%d stream and %d v1 requests for %d items", stream, v1, len(rows))
	}
	if h.emu.AppliedCount() != len(rows) || len(h.emu.DuplicateApplications()) != 0 {
		t.Fatalf("applied %d, duplicates %v", h.emu.AppliedCount(), h.emu.DuplicateApplications())
	}
	if st.Client().Refreshes() != 1 {
		t.Fatalf("sessions %d, want 1", st.Client().Refreshes())
	}
	// Back to v1: the next item goes by the v1 call.
	h.exec(`UPDATE stripe_accounts SET exporter = 'v1' WHERE account_id = $1`, acct)
	last := h.stage(h.item("org_s01", "event:v1-again", 2))
	h.publish(last.ID)
	h.awaitState(last.ID, outbox.StateAccepted)
	if rs := h.emu.RequestsFor(last.IdempotencyKey); len(rs) != 1 || rs[0].Route != stripeemulator.RouteMeterEventCreate {
		t.Fatalf("requests %+v", rs)
	}
}

// silentAfter200 passes one key's first call to the stream and, once the
// stream answered it, goes silent like a killed process: the outcome is
// not returned (so not written) until release is closed.
type silentAfter200 struct {
	deliverer.Exporter
	key      string
	once     sync.Once
	answered chan struct{}
	release  chan struct{}
}

func (s *silentAfter200) Export(ctx context.Context, r deliverer.Request) deliverer.Result {
	res := s.Exporter.Export(ctx, r)
	if r.Key == s.key {
		first := false
		s.once.Do(func() { first = true })
		if first {
			close(s.answered)
			<-s.release
		}
	}
	return res
}

// Must show: the holder dies between a stream 200 and its outcome write.
// The lease expires, another deliverer claims the item and resends it
// under the same identifier in a stream request; Stripe (the emulator)
// has it already and applies nothing again; the item is accepted once,
// and the silent holder's late write is refused by the lease fence.
func TestMustShowStreamSilentBetween200AndOutcome(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stripeemulator.Faults{})
	h.exec(`UPDATE stripe_accounts SET exporter = 'stream' WHERE account_id = $1`, acct)
	row := h.stage(h.item("org_1", "event:kill", 6))
	lease := 30 * time.Second
	ttl := deliverer.WithPinnedTTL(300 * time.Millisecond)
	exp1, _ := h.streamRouter()
	silent := &silentAfter200{Exporter: exp1, key: row.IdempotencyKey, answered: make(chan struct{}), release: make(chan struct{})}
	d1 := h.startExp(testConfig(), silent, deliverer.WithLease(lease), ttl)
	h.publish(row.ID)
	<-silent.answered
	if h.emu.Applications(row.IdempotencyKey) != 1 {
		t.Fatal("the stream did not apply the event")
	}
	d1.cancel() // stops pulling; its call never returns an outcome meanwhile

	h.clk.Advance(lease + time.Second)
	exp2, _ := h.streamRouter()
	h.startExp(testConfig(), exp2, deliverer.WithLease(lease), ttl)
	h.redispatch(row.ID)
	final := h.awaitState(row.ID, outbox.StateAccepted)
	if final.LeaseToken != 2 {
		t.Fatalf("accepted with lease token %d, want 2", final.LeaseToken)
	}
	close(silent.release)
	<-d1.done
	if d1.stale() != 1 {
		t.Fatalf("silent holder's stale writes %v, want 1", d1.stale())
	}
	if n := h.emu.Applications(row.IdempotencyKey); n != 1 || len(h.emu.DuplicateApplications()) != 0 {
		t.Fatalf("applied %d times", n)
	}
	reqs := h.emu.RequestsFor(row.IdempotencyKey)
	if len(reqs) != 2 {
		t.Fatalf("%d stream requests for the item, want 2", len(reqs))
	}
	for _, r := range reqs {
		if r.Route != stripeemulator.RouteMeterEventStream || len(r.Identifiers) != 1 || r.Identifiers[0] != row.IdempotencyKey || r.BodySHA256 != reqs[0].BodySHA256 {
			t.Fatalf("request %+v", r)
		}
	}
	if got := outcomes(h.attempts(row.ID)); fmt.Sprint(got) != "[stale_lease accepted]" {
		t.Fatalf("attempt outcomes by token: %v", got)
	}
}
