package relay

import (
	"context"
	"testing"

	"github.com/aurora-billing/aurora/shared/natstest"
	"github.com/aurora-billing/aurora/shared/outbox"
)

func TestPublishesCommittedRowsOnceWithContract(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	_, js := connect(t, natstest.New(t))
	ctx := context.Background()
	ids := stage(t, pool, items("org_123", 0, 10)...)
	start(t, pool, js, testConfig())
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
}
