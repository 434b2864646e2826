package deliverer_test

import (
	"github.com/aurora-billing/aurora/internal/syncbuf"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/deliverer"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/aurora-billing/aurora/stripeemulator"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestGracefulShutdown: a call in flight when Run's context ends finishes
// and records its outcome before Run returns; nothing new is pulled.
func TestGracefulShutdown(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stripeemulator.Faults{Latency: 400 * time.Millisecond})
	r := h.start(testConfig())
	row := h.stage(h.item("org_1", "event:shutdown", 1))
	h.publish(row.ID)
	h.await("call in flight", func() bool { return h.emu.Stats().InFlight == 1 })
	r.stop(t)
	if got := h.get(row.ID); got.State != outbox.StateAccepted {
		t.Fatalf("after graceful stop: %s", got.State)
	}
}

// TestShutdownTimeoutCancelsCalls: past the shutdown timeout an in-flight
// call is cancelled and recorded as a retry with the same key.
func TestShutdownTimeoutCancelsCalls(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stripeemulator.Faults{})
	cfg := testConfig()
	cfg.ShutdownSeconds = 1
	r := h.start(cfg)
	row := h.stage(h.item("org_1", "event:hang", 1))
	h.emu.Script(row.IdempotencyKey, mustAnswer(t, "timeout"))
	h.publish(row.ID)
	h.await("call in flight", func() bool { return h.emu.Stats().InFlight == 1 })
	r.stop(t)
	got := h.get(row.ID)
	if got.State != outbox.StatePending || got.Dispatch != 2 {
		t.Fatalf("after forced stop: %s dispatch %d", got.State, got.Dispatch)
	}
	if as := h.attempts(row.ID); len(as) != 1 || *as[0].Outcome != "retry" || *as[0].ErrorCode != "timeout" {
		t.Fatalf("attempts %v", outcomes(as))
	}
}

// TestLogsAndMetrics: logs carry item ids and key prefixes, never customer
// ids, payload values, full keys, Stripe messages or the API key; outcomes
// are counted by kind and reason.
func TestLogsAndMetrics(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stripeemulator.Faults{})
	var buf syncbuf.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	r := h.start(testConfig(), deliverer.WithLogger(log))
	ok := h.stage(h.item("org_1", "event:log-ok", 424242))
	gone := h.stage(h.item("org_1", "event:log-gone", 1))
	h.emu.Script(gone.IdempotencyKey, mustAnswer(t, "400:meter_event_customer_not_found"))
	h.publish(ok.ID)
	h.publish(gone.ID)
	h.awaitState(ok.ID, outbox.StateAccepted)
	h.awaitState(gone.ID, outbox.StateQuarantined)
	out := buf.String()
	for _, secret := range []string{customer, testKey, ok.IdempotencyKey, gone.IdempotencyKey, "424242"} {
		if strings.Contains(out, secret) {
			t.Errorf("log contains %q:\n%s", secret, out)
		}
	}
	if !strings.Contains(out, ok.IdempotencyKey[:12]) {
		t.Errorf("log lacks the key prefix:\n%s", out)
	}
	mfs, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for _, mf := range mfs {
		found[mf.GetName()] = true
	}
	for _, name := range []string{"aurora_deliverer_outcomes_total", "aurora_deliverer_provider_seconds", "aurora_deliverer_inflight_calls", "aurora_deliverer_stale_leases_total"} {
		if !found[name] {
			t.Errorf("metric %s missing", name)
		}
	}
	// The counters move just after the outcome commits (what awaitState
	// watched): wait for them.
	h.await("outcome series accepted and quarantined/customer_missing", func() bool {
		n, err := testutil.GatherAndCount(r.reg, "aurora_deliverer_outcomes_total")
		return err == nil && n == 2
	})
}
