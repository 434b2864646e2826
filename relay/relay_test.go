package relay

import (
	"context"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/shared/natstest"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/prometheus/client_golang/prometheus"
)

func TestPublishesCommittedRowsOnceWithContract(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	_, js := connect(t, natstest.New(t))
	ctx := context.Background()
	ids := stage(t, pool, items("org_123", 0, 10)...)
	reg := prometheus.NewRegistry()
	start(t, pool, js, testConfig(), WithRegistry(reg))
	eventually(t, "all rows published", func() (bool, error) {
		n, err := publishedCount(ctx, pool)
		return n == len(ids), err
	})
	msgs := streamMsgs(t, js)
	if len(msgs) != len(ids) {
		t.Fatalf("stream holds %d messages, want %d", len(msgs), len(ids))
	}
	for _, m := range msgs {
		row, err := outbox.Get(ctx, pool, m.body.ItemID)
		if err != nil {
			t.Fatal(err)
		}
		lane := outbox.UnmappedLane(row.DestinationAccount, row.Tenant, row.Feature) // the test rows have no customer or meter
		want := outbox.PartitionSubject(row.Exporter, row.Tenant, outbox.Partition(lane, outbox.PartitionsDefault))
		if m.subject != want || m.body.Lane != lane {
			t.Errorf("item %d subject %q lane %q, want %q and %q", row.ID, m.subject, m.body.Lane, want, lane)
		}
		if m.msgID != outbox.MsgID(row.IdempotencyKey, 1) || m.body.Key != row.IdempotencyKey || m.body.Dispatch != 1 || m.body.Feature != row.Feature {
			t.Errorf("item %d: msg id %q body %+v, want dispatch 1 of key %s, feature %s", row.ID, m.msgID, m.body, row.IdempotencyKey, row.Feature)
		}
		if row.PublishedDispatch != 1 || row.PublishedAt == nil || row.State != outbox.StatePending {
			t.Errorf("item %d not marked: %+v", row.ID, row)
		}
	}
	if v, err := counterValue(reg, "aurora_relay_published_total"); err != nil || v != float64(len(ids)) {
		t.Errorf("published_total %v (err %v), want %d", v, err, len(ids))
	}
	for _, name := range []string{"aurora_relay_inflight_messages", "aurora_relay_oldest_unpublished_age_seconds"} {
		if v := gauge(t, reg, name); v != 0 {
			t.Errorf("%s = %v after draining, want 0", name, v)
		}
	}
}

// SIGTERM in the middle of a batch: the batch finishes (its PubAcks are
// recorded and committed) before Run returns nil, so a graceful stop leaves
// nothing published but unmarked.
func TestGracefulStopFinishesTheBatchInProgress(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	_, js := connect(t, natstest.New(t))
	ctx := context.Background()
	ids := stage(t, pool, items("org_stop", 0, 20)...)
	cfg := testConfig()
	cfg.Workers = 1
	r, err := New(pool, js, cfg, WithLogger(quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	r.hooks.afterPublish = func(context.Context, []int64) error {
		cancel() // the stop arrives after the PubAcks, before the marks
		return nil
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after a graceful stop: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return")
	}
	n, err := publishedCount(ctx, pool)
	if err != nil || n != len(ids) {
		t.Fatalf("%d of %d rows marked after the stop (err %v)", n, len(ids), err)
	}
	if c, _ := streamCount(js); c != uint64(len(ids)) {
		t.Fatalf("stream holds %d, want %d", c, len(ids))
	}
}
