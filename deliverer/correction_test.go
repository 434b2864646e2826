package deliverer_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/deliverer"
	"github.com/aurora-billing/aurora/deliverer/stripeexport"
	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/aurora-billing/aurora/shared/usage"
	"github.com/aurora-billing/aurora/stripeemulator"
	"github.com/jackc/pgx/v5"
)

// record records ev through the usage gate (events source: the correction
// steps apply) and returns its export item.
func (h *harness) record(ev usage.Event) outbox.Row {
	h.t.Helper()
	g := usage.Gate{Recorder: usage.Recorder{DestinationAccount: acct, Mode: identity.ModeTest, Period: usage.PeriodDay},
		Sources: usage.Sources{feature: usage.SourceEvents}}
	var row outbox.Row
	err := pgx.BeginFunc(context.Background(), h.pool, func(tx pgx.Tx) error {
		var err error
		row, _, err = g.Record(context.Background(), tx, ev)
		return err
	})
	if err != nil {
		h.t.Fatal(err)
	}
	return row
}

// applied returns the emulator's applied event of identifier, if any.
func (h *harness) applied(identifier string) (stripeemulator.AppliedEvent, int) {
	var out stripeemulator.AppliedEvent
	n := 0
	for _, ev := range h.emu.Applied() {
		if ev.Identifier == identifier {
			out, n = ev, n+1
		}
	}
	return out, n
}

// adjustments returns the emulator's cancel requests of identifier.
func (h *harness) adjustments(identifier string) []stripeemulator.RequestRecord {
	var out []stripeemulator.RequestRecord
	for _, r := range h.emu.RequestsFor(identifier) {
		if r.Route == stripeemulator.RouteAdjustmentCreate {
			out = append(out, r)
		}
	}
	return out
}

// deliver publishes row's current dispatch and waits for state.
func (h *harness) deliver(row outbox.Row, state outbox.State) outbox.Row {
	h.t.Helper()
	h.publish(row.ID)
	return h.awaitState(row.ID, state)
}

// TestCorrectionPlans: each plan action of a correction, through the
// running deliverer against the emulator, on a v1 and on a stream account.
func TestCorrectionPlans(t *testing.T) {
	t.Parallel()
	for _, via := range []string{"v1", "stream"} {
		t.Run(via, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, stripeemulator.Faults{})
			if via == "stream" {
				h.exec(`UPDATE stripe_accounts SET exporter = 'stream' WHERE account_id = $1`, acct)
				exp, _ := h.streamRouter()
				h.startExp(testConfig(), exp)
			} else {
				h.start(testConfig())
			}
			at := h.clk.Now().Add(-time.Minute)
			type tc struct {
				name      string
				orig, d   int64
				rejected  bool          // the original is rejected before the correction
				state     outbox.State  // the correction's end state
				reason    outbox.Reason // when quarantined
				cancelled bool          // the original's event is cancelled at Stripe
				restated  int64         // value under the correction's identifier (0 = none)
			}
			cases := []tc{
				{name: "send_event", orig: 10, d: 3, state: outbox.StateAccepted, restated: 3},
				{name: "cancel_restate", orig: 10, d: -4, state: outbox.StateAccepted, cancelled: true, restated: 6},
				{name: "cancel_to_zero", orig: 10, d: -10, state: outbox.StateAccepted, cancelled: true},
				{name: "not_cancellable_rejected", orig: 10, d: -4, rejected: true, state: outbox.StateQuarantined, reason: outbox.ReasonNegativeQuantity},
			}
			for i, c := range cases {
				tenant := "org_1"
				orig := h.record(usage.Event{Tenant: tenant, EventID: c.name, Feature: feature, Quantity: c.orig, OccurredAt: at})
				if c.rejected {
					h.exec(`UPDATE outbox_items SET state = 'rejected' WHERE id = $1`, orig.ID)
				} else {
					h.deliver(orig, outbox.StateAccepted)
				}
				corr := h.record(usage.Event{Tenant: tenant, EventID: c.name + "-fix", Feature: feature, Quantity: c.d, OccurredAt: at, CorrectsEventID: c.name})
				got := h.deliver(corr, c.state)
				if c.state == outbox.StateQuarantined {
					if got.QuarantineReason == nil || *got.QuarantineReason != c.reason || got.LastError == nil || !strings.Contains(*got.LastError, "rejected") {
						t.Fatalf("%d %s: reason %v, last_error %v", i, c.name, got.QuarantineReason, got.LastError)
					}
				}
				ev, n := h.applied(orig.IdempotencyKey)
				if !c.rejected && (n != 1 || ev.Cancelled != c.cancelled || ev.Value != float64(c.orig)) {
					t.Fatalf("%s: original %+v (%d applied)", c.name, ev, n)
				}
				if adj := h.adjustments(orig.IdempotencyKey); c.cancelled != (len(adj) == 1) ||
					(c.cancelled && adj[0].IdempotencyKey != corr.IdempotencyKey+":cancel") {
					t.Fatalf("%s: cancel requests %+v", c.name, adj)
				}
				if c.restated > 0 {
					route := stripeemulator.RouteMeterEventCreate
					if via == "stream" {
						route = stripeemulator.RouteMeterEventStream
					}
					if rs := h.emu.RequestsFor(corr.IdempotencyKey); len(rs) != 1 || rs[0].Route != route {
						t.Fatalf("%s: requests of the correction %+v, want one by %s", c.name, rs, route)
					}
				}
				ev, n = h.applied(corr.IdempotencyKey)
				if (c.restated == 0) != (n == 0) || (n > 0 && (n != 1 || ev.Value != float64(c.restated) || ev.Cancelled)) {
					t.Fatalf("%s: under the correction's identifier %+v (%d applied), want %d", c.name, ev, n, c.restated)
				}
			}
			// What Stripe bills equals what was committed: 13 + 6 + 0.
			if got := h.emu.AppliedTotals()[feature]; got != 19 {
				t.Fatalf("applied total %v, want 19", got)
			}
			if len(h.emu.DuplicateApplications()) != 0 {
				t.Fatalf("duplicates %v", h.emu.DuplicateApplications())
			}
		})
	}
}

// TestCorrectionRetryBetweenCancelAndRestate: the cancel lands, the restate
// fails (500); the retry replays the cancel under the same Idempotency-Key
// (Stripe answers its saved 200) and sends the restate under the same
// identifier: the original is cancelled once, the restate applied once.
func TestCorrectionRetryBetweenCancelAndRestate(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stripeemulator.Faults{})
	h.start(testConfig())
	at := h.clk.Now().Add(-time.Minute)
	orig := h.record(usage.Event{Tenant: "org_1", EventID: "e-1", Feature: feature, Quantity: 10, OccurredAt: at})
	h.deliver(orig, outbox.StateAccepted)
	fix := usage.Event{Tenant: "org_1", EventID: "e-1-fix", Feature: feature, Quantity: -4, OccurredAt: at, CorrectsEventID: "e-1"}
	key := identity.Key("org_1", identity.SubjectCorrection, usage.SubjectRef(fix), acct)
	h.emu.Script(key, mustAnswer(t, "500"))
	corr := h.record(fix)
	h.publish(corr.ID)
	h.await("retry after the restate's 500", func() bool {
		r := h.get(corr.ID)
		return r.State == outbox.StatePending && r.Attempts == 1
	})
	if ev, _ := h.applied(orig.IdempotencyKey); !ev.Cancelled {
		t.Fatal("the cancel did not land before the restate failed")
	}
	h.clk.Set(h.get(corr.ID).NextAttemptAt)
	h.deliver(corr, outbox.StateAccepted)
	adj := h.adjustments(orig.IdempotencyKey)
	if len(adj) != 2 || adj[0].IdempotencyKey != adj[1].IdempotencyKey || adj[1].Status != 200 {
		t.Fatalf("cancel requests %+v, want the same key twice, both 200", adj)
	}
	if ev, n := h.applied(corr.IdempotencyKey); n != 1 || ev.Value != 6 {
		t.Fatalf("restate %+v (%d applied)", ev, n)
	}
	if got := h.emu.AppliedTotals()[feature]; got != 6 || len(h.emu.DuplicateApplications()) != 0 {
		t.Fatalf("applied total %v, duplicates %v", got, h.emu.DuplicateApplications())
	}
}

// TestCorrectionWaitSpendsNoAttempt: while the original is pending the
// correction waits; a wait gives its attempt back (attempts 0, no first
// attempt, so neither the limit nor the horizon moves) and is re-checked
// on a backoff; once the original is accepted the correction cancels and
// restates with one counted attempt.
func TestCorrectionWaitSpendsNoAttempt(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stripeemulator.Faults{})
	cfg := testConfig()
	cfg.MaxAttempts = 2
	h.start(cfg)
	at := h.clk.Now().Add(-time.Minute)
	orig := h.record(usage.Event{Tenant: "org_1", EventID: "e-1", Feature: feature, Quantity: 10, OccurredAt: at})
	corr := h.record(usage.Event{Tenant: "org_1", EventID: "e-1-fix", Feature: feature, Quantity: -4, OccurredAt: at, CorrectsEventID: "e-1"})
	var delays []time.Duration
	for i := range 4 { // more waits than the attempts limit
		before := h.get(corr.ID)
		h.publish(corr.ID)
		h.await("wait recorded", func() bool {
			r := h.get(corr.ID)
			return r.State == outbox.StatePending && r.Dispatch > before.Dispatch
		})
		r := h.get(corr.ID)
		if r.Attempts != 0 || r.FirstAttemptAt != nil || r.LastError == nil || !strings.HasPrefix(*r.LastError, "correction_wait: ") {
			t.Fatalf("wait %d: attempts %d, first attempt %v, last_error %v", i, r.Attempts, r.FirstAttemptAt, r.LastError)
		}
		delays = append(delays, r.NextAttemptAt.Sub(h.clk.Now()))
		h.clk.Set(r.NextAttemptAt)
	}
	if delays[3] <= delays[0] {
		t.Fatalf("wait delays %v do not back off", delays)
	}
	if n := len(h.emu.Requests()); n != 0 {
		t.Fatalf("%d provider requests while waiting", n)
	}
	h.deliver(orig, outbox.StateAccepted)
	got := h.deliver(corr, outbox.StateAccepted)
	if got.Attempts != 1 {
		t.Fatalf("attempts %d after 4 waits and the send, want 1", got.Attempts)
	}
	if ev, _ := h.applied(orig.IdempotencyKey); !ev.Cancelled {
		t.Fatal("original not cancelled")
	}
	if got := h.emu.AppliedTotals()[feature]; got != 6 {
		t.Fatalf("applied total %v, want 6", got)
	}
	var waits int
	if err := h.pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox_attempts WHERE item_id = $1 AND error_code = 'correction_wait'`, corr.ID).Scan(&waits); err != nil || waits != 4 {
		t.Fatalf("wait attempt rows %d (%v), want 4", waits, err)
	}
}

// TestCorrectionPastCancelWindowQuarantines: the original reached Stripe
// more than 23 h ago by the database clock: negative_quantity, nothing sent.
func TestCorrectionPastCancelWindowQuarantines(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stripeemulator.Faults{})
	h.start(testConfig())
	at := h.clk.Now().Add(-time.Minute)
	orig := h.record(usage.Event{Tenant: "org_1", EventID: "e-1", Feature: feature, Quantity: 10, OccurredAt: at})
	h.deliver(orig, outbox.StateAccepted)
	h.exec(`UPDATE outbox_items SET first_attempt_at = first_attempt_at - interval '24 hours' WHERE id = $1`, orig.ID)
	corr := h.record(usage.Event{Tenant: "org_1", EventID: "e-1-fix", Feature: feature, Quantity: -4, OccurredAt: at, CorrectsEventID: "e-1"})
	got := h.deliver(corr, outbox.StateQuarantined)
	if got.QuarantineReason == nil || *got.QuarantineReason != outbox.ReasonNegativeQuantity || !strings.Contains(*got.LastError, "23 h") {
		t.Fatalf("reason %v, last_error %v", got.QuarantineReason, got.LastError)
	}
	if adj := h.adjustments(orig.IdempotencyKey); len(adj) != 0 {
		t.Fatalf("cancel sent: %+v", adj)
	}
}

// silentAfterCancel passes the first cancel to Stripe and, once Stripe
// answered it, goes silent like a killed process: neither the restate nor
// an outcome follows until release is closed.
type silentAfterCancel struct {
	*stripeexport.Exporter
	once     sync.Once
	answered chan struct{}
	release  chan struct{}
}

func (s *silentAfterCancel) Cancel(ctx context.Context, r deliverer.CancelRequest) deliverer.Result {
	res := s.Exporter.Cancel(ctx, r)
	first := false
	s.once.Do(func() { first = true })
	if first {
		close(s.answered)
		<-s.release
	}
	return res
}

// Must show: the holder dies between the cancel and the restate. The
// lease expires, another deliverer claims the correction, replays the
// cancel under the same Idempotency-Key (Stripe's saved 200, nothing
// cancelled twice) and sends the restate: applied once; the silent
// holder's late write is refused by the lease fence.
func TestCorrectionKilledBetweenCancelAndRestate(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stripeemulator.Faults{})
	lease := 30 * time.Second
	ttl := deliverer.WithPinnedTTL(300 * time.Millisecond)
	at := h.clk.Now().Add(-time.Minute)
	orig := h.record(usage.Event{Tenant: "org_1", EventID: "e-1", Feature: feature, Quantity: 10, OccurredAt: at})
	corr := h.record(usage.Event{Tenant: "org_1", EventID: "e-1-fix", Feature: feature, Quantity: -4, OccurredAt: at, CorrectsEventID: "e-1"})
	v1, err := stripeexport.New(stripeexport.Config{APIKey: testKey, APIBase: h.srv.URL}, 10*time.Second, 8)
	if err != nil {
		t.Fatal(err)
	}
	silent := &silentAfterCancel{Exporter: v1, answered: make(chan struct{}), release: make(chan struct{})}
	d1 := h.startExp(testConfig(), silent, deliverer.WithLease(lease), ttl)
	h.deliver(orig, outbox.StateAccepted)
	h.publish(corr.ID)
	<-silent.answered
	if ev, _ := h.applied(orig.IdempotencyKey); !ev.Cancelled {
		t.Fatal("the cancel did not land")
	}
	d1.cancel() // stops pulling; its call never returns meanwhile

	h.clk.Advance(lease + time.Second)
	v1b, err := stripeexport.New(stripeexport.Config{APIKey: testKey, APIBase: h.srv.URL}, 10*time.Second, 8)
	if err != nil {
		t.Fatal(err)
	}
	h.startExp(testConfig(), v1b, deliverer.WithLease(lease), ttl)
	h.redispatch(corr.ID)
	final := h.awaitState(corr.ID, outbox.StateAccepted)
	if final.LeaseToken != 2 {
		t.Fatalf("accepted with lease token %d, want 2", final.LeaseToken)
	}
	close(silent.release)
	<-d1.done
	if d1.stale() != 1 {
		t.Fatalf("silent holder's stale writes %v, want 1", d1.stale())
	}
	adj := h.adjustments(orig.IdempotencyKey)
	if len(adj) < 2 || adj[0].IdempotencyKey != adj[1].IdempotencyKey {
		t.Fatalf("cancel requests %+v, want the same key each time", adj)
	}
	if ev, n := h.applied(corr.IdempotencyKey); n != 1 || ev.Value != 6 {
		t.Fatalf("restate %+v (%d applied)", ev, n)
	}
	if got := h.emu.AppliedTotals()[feature]; got != 6 || len(h.emu.DuplicateApplications()) != 0 {
		t.Fatalf("applied total %v, duplicates %v", got, h.emu.DuplicateApplications())
	}
}
