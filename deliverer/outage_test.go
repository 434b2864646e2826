package deliverer_test

import (
	"context"
	"fmt"
	"github.com/aurora-billing/aurora/internal/syncbuf"
	"log/slog"
	"strings"
	"testing"

	"github.com/aurora-billing/aurora/deliverer"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/aurora-billing/aurora/stripeemulator"
	"github.com/nats-io/nats.go/jetstream"
)

// While every claim fails (here: the outbox table is away, as in a
// Postgres outage every group's claim fails, hundreds a second), the
// deliverer logs "claim failed" at most once per 5 s, each line saying how
// many failures it stands for, and counts every one in
// aurora_deliverer_errors_total{op="claim"}; once claims work again every
// message is delivered, nothing lost. (The chaos harness's kill_postgres
// fault logged 3,898 such lines in ten seconds before.)
func TestClaimFailuresLogAtMostEveryFewSeconds(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stripeemulator.Faults{})
	const tenants = 30
	type pub struct {
		subject string
		body    []byte
		msgID   string
		id      int64
	}
	var pubs []pub
	for i := range tenants {
		tenant := fmt.Sprintf("org_o%d", i)
		h.addTenant(tenant, fmt.Sprintf("cus_o%d", i))
		row := h.stage(h.item(tenant, fmt.Sprintf("event:outage%d", i), 1))
		got := h.get(row.ID)
		subject, msg := laneMessage(t, h.pool, got)
		pubs = append(pubs, pub{subject, msg.Encode(), outbox.MsgID(got.IdempotencyKey, got.Dispatch), row.ID})
	}
	var logs syncbuf.Buffer
	r := h.start(testConfig(), deliverer.WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))))
	h.await("ready", func() bool { return r.d.Ready() == nil })

	ctx := context.Background()
	if _, err := h.pool.Exec(ctx, `ALTER TABLE outbox_items RENAME TO outbox_items_away`); err != nil {
		t.Fatal(err)
	}
	for _, p := range pubs {
		if _, err := h.js.Publish(ctx, p.subject, p.body, jetstream.WithMsgID(p.msgID)); err != nil {
			t.Fatal(err)
		}
	}
	h.await("claims failing", func() bool {
		return labelled(t, r.reg, "aurora_deliverer_errors_total", "op", "claim") >= 2*tenants
	})
	lines := strings.Count(logs.String(), "claim failed")
	if lines < 1 || lines > 2 {
		t.Fatalf("%d \"claim failed\" lines for %v failed claims, want 1 or 2 (at most one per 5 s)", lines,
			labelled(t, r.reg, "aurora_deliverer_errors_total", "op", "claim"))
	}
	if !strings.Contains(logs.String(), "failures_since_last_line") {
		t.Fatalf("the line does not say how many failures it stands for: %s", logs.String())
	}
	if _, err := h.pool.Exec(ctx, `ALTER TABLE outbox_items_away RENAME TO outbox_items`); err != nil {
		t.Fatal(err)
	}
	for _, p := range pubs {
		h.awaitState(p.id, outbox.StateAccepted)
	}
	if n := h.emu.AppliedCount(); n != tenants {
		t.Fatalf("applied %d, want %d", n, tenants)
	}
}
