package deliverer_test

import (
	"testing"
	"time"

	"github.com/aurora-billing/aurora/deliverer"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/aurora-billing/aurora/stripeemulator"
)

// A holder whose outcome the lease fence refuses leaves the message alone.
// JetStream settles a message by stream sequence, whichever delivery the
// ack names: had the refused holder acked, the work-queue stream would drop
// the message the current holder was given by a redelivery, and if that
// holder then died the item would sit leased until the relay's re-dispatch
// interval (300 s by default). Here the current holder takes the lease and
// dies (its lease expires on the manual clock); the message, still in the
// stream, is redelivered to a second deliverer, which claims the item and
// resends it under the same key: applied once.
func TestStaleOutcomeLeavesTheMessageToTheCurrentHolder(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stripeemulator.Faults{})
	row := h.stage(h.item("org_1", "event:stale-ack", 5))
	lease := 30 * time.Second
	opts := []deliverer.Option{deliverer.WithLease(lease), deliverer.WithPinnedTTL(300 * time.Millisecond), deliverer.WithAckWait(600 * time.Millisecond)}
	exp, _ := h.streamRouter()
	silent := &silentAfter200{Exporter: exp, key: row.IdempotencyKey, answered: make(chan struct{}), release: make(chan struct{})}
	d1 := h.startExp(testConfig(), silent, opts...)
	h.publish(row.ID)
	<-silent.answered
	d1.cancel() // stops pulling; its call has not returned yet

	// Another deliverer claims the item meanwhile (as it would when handed
	// the same message by a redelivery), then dies holding the lease.
	h.clk.Advance(lease + time.Second)
	h.exec(`UPDATE outbox_items SET lease_token = lease_token + 1, attempts = attempts + 1,
	        leased_at = $2, lease_expires_at = $2::timestamptz + make_interval(secs => 30)
	        WHERE id = $1 AND state = 'leased'`, row.ID, h.clk.Now())
	close(silent.release)
	<-d1.done
	if d1.stale() != 1 {
		t.Fatalf("first holder's stale writes %v, want 1", d1.stale())
	}
	if n := h.pending(); n != 1 {
		t.Fatalf("%d messages left in the stream after the refused outcome, want 1 (the current holder's)", n)
	}

	h.clk.Advance(lease + time.Second) // the second holder's lease expires too
	d2 := h.startExp(testConfig(), exp, opts...)
	final := h.awaitState(row.ID, outbox.StateAccepted)
	if final.LeaseToken != 3 {
		t.Fatalf("accepted with lease token %d, want 3", final.LeaseToken)
	}
	if n := h.emu.Applications(row.IdempotencyKey); n != 1 || len(h.emu.DuplicateApplications()) != 0 {
		t.Fatalf("applied %d times", n)
	}
	_ = d2
}
