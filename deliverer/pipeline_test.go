package deliverer_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/aurora-billing/aurora/relay"
	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/aurora-billing/aurora/stripeemulator"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestPipelineWithRelay runs the export path end to end: rows committed in
// Postgres, published by the relay (same manual clock), delivered by two
// deliverers; a 500 becomes a retry that the relay publishes as a new
// dispatch once due on the manual clock; everything is applied once.
func TestPipelineWithRelay(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stripeemulator.Faults{})
	h.start(testConfig())
	h.start(testConfig())
	rc := relay.DefaultConfig()
	rc.PollMS = 20
	rc.RedispatchScanMS = 20
	h.runRelay(rc)

	var rows []outbox.Row
	for i := range 10 {
		tenant := fmt.Sprintf("org_p%d", i%3)
		if i < 3 {
			h.addTenant(tenant, fmt.Sprintf("cus_p%d", i))
		}
		it := h.item(tenant, fmt.Sprintf("event:p%d", i), int64(i+1))
		if i == 4 { // the key is a pure function of the identity: script it before the relay sees the row
			h.emu.Script(identity.Key(it.Tenant, it.SubjectKind, it.SubjectRef, it.DestinationAccount), mustAnswer(t, "500"))
		}
		rows = append(rows, h.stage(it))
	}
	// The retry is recorded: pending again after an attempt, with a new
	// dispatch the relay publishes once due.
	h.await("retry of item 4", func() bool {
		r := h.get(rows[4].ID)
		return r.State == outbox.StatePending && r.Attempts >= 1
	})
	h.clk.Set(h.get(rows[4].ID).NextAttemptAt)
	for _, r := range rows {
		h.awaitState(r.ID, outbox.StateAccepted)
	}
	if n := len(h.emu.Applied()); n != 10 || len(h.emu.DuplicateApplications()) != 0 || h.emu.Overlaps() != 0 {
		t.Fatalf("applied %d, duplicates %v, overlaps %d", n, h.emu.DuplicateApplications(), h.emu.Overlaps())
	}
	sameWire(t, h, rows[4].IdempotencyKey, 2)
}

// TestRelayBatchMessagesDelivered: a relay with
// AURORA_RELAY_BATCH_MESSAGE_ITEMS at 50 and this build's deliverers (their
// partition consumers accept batches): items of several tenants travel in
// batch messages (at most one item of a lane each) and every one is
// accepted and applied once, the stream drained.
func TestRelayBatchMessagesDelivered(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stripeemulator.Faults{})
	r := h.start(testConfig())
	h.await("partition consumers attached", func() bool {
		for p := range outbox.PartitionsDefault {
			c, err := h.js.Consumer(context.Background(), outbox.StreamName, r.d.ConsumerName(p))
			if err != nil || c.CachedInfo().Config.Metadata[outbox.MetaBatchMessages] != "1" {
				return false
			}
		}
		return true
	})
	// 20 lanes (a customer each) over 16 partitions: some partition holds
	// two, so some message is a batch (one item of a lane per message).
	for i := range 20 {
		h.addTenant(fmt.Sprintf("org_rb%d", i), fmt.Sprintf("cus_rb%d", i))
	}
	var rows []outbox.Row
	for i := range 40 {
		rows = append(rows, h.stage(h.item(fmt.Sprintf("org_rb%d", i%20), fmt.Sprintf("event:rb%d", i), 1)))
	}
	reg := prometheus.NewRegistry()
	rc := relay.DefaultConfig()
	rc.PollMS = 20
	rc.BatchMessageItems = 50
	h.runRelay(rc, relay.WithRegistry(reg))
	for _, row := range rows {
		h.awaitState(row.ID, outbox.StateAccepted)
	}
	h.await("stream drained", func() bool { return h.pending() == 0 })
	for _, row := range rows {
		if n := h.emu.Applications(row.IdempotencyKey); n != 1 {
			t.Fatalf("item %d applied %d times", row.ID, n)
		}
	}
	if n := testutil.ToFloat64(mustCounter(reg, "aurora_relay_batch_messages_total")); n < 1 {
		t.Fatal("no batch message was published")
	}
}
