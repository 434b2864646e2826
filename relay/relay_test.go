package relay

import (
	"context"
	"testing"

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
		if m.subject != outbox.Subject(row.Exporter, row.Tenant) {
			t.Errorf("item %d subject %q, want %q", row.ID, m.subject, outbox.Subject(row.Exporter, row.Tenant))
		}
		if m.msgID != outbox.MsgID(row.IdempotencyKey, 1) || m.body.Key != row.IdempotencyKey || m.body.Dispatch != 1 {
			t.Errorf("item %d: msg id %q body %+v, want dispatch 1 of key %s", row.ID, m.msgID, m.body, row.IdempotencyKey)
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
