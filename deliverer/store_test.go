package deliverer

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

type storeFixture struct {
	t    *testing.T
	pool *pgxpool.Pool
	now  time.Time
}

func newStore(t *testing.T) *storeFixture {
	t.Helper()
	f := &storeFixture{t: t, pool: dbtest.New(t), now: time.Now().UTC().Add(time.Minute).Truncate(time.Microsecond)}
	f.exec(`INSERT INTO stripe_accounts (account_id, mode, confirmed) VALUES ('acct_s', 'test', true)`)
	f.exec(`INSERT INTO meter_mappings (destination_account, feature, meter_id, event_name) VALUES ('acct_s', 'api_calls', 'mtr_1', 'api_calls')`)
	f.exec(`INSERT INTO tenant_billing (tenant, destination_account, stripe_customer) VALUES ('org_s', 'acct_s', 'cus_s')`)
	return f
}

func (f *storeFixture) exec(sql string, args ...any) {
	f.t.Helper()
	if _, err := f.pool.Exec(context.Background(), sql, args...); err != nil {
		f.t.Fatalf("%s: %v", sql, err)
	}
}

func (f *storeFixture) stage(ref string) outbox.Row {
	f.t.Helper()
	var row outbox.Row
	err := pgx.BeginFunc(context.Background(), f.pool, func(tx pgx.Tx) error {
		var err error
		row, err = outbox.Stage(context.Background(), tx, outbox.Item{
			Identity: identity.Identity{Tenant: "org_s", SubjectKind: identity.SubjectEvent, SubjectRef: ref,
				Exporter: outbox.DefaultExporter, DestinationAccount: "acct_s", Mode: identity.ModeTest, MappingVersion: 1},
			Feature: "api_calls", Quantity: 1, OccurredAt: f.now,
		})
		return err
	})
	if err != nil {
		f.t.Fatal(err)
	}
	return row
}

func (f *storeFixture) claim(row outbox.Row, at time.Time) claimResult {
	f.t.Helper()
	r, err := claimItem(context.Background(), f.pool, claimParams{Now: &at, ItemID: row.ID, Dispatch: row.Dispatch,
		Exporter: row.Exporter, Key: row.IdempotencyKey, Lease: time.Minute})
	if err != nil {
		f.t.Fatal(err)
	}
	return r
}

// lockItem locks the item's row in mode ("UPDATE", "KEY SHARE", …) from
// another transaction, as a concurrent claim or foreign-key check would,
// until release is called (or the test ends).
func (f *storeFixture) lockItem(id int64, mode string) (release func()) {
	f.t.Helper()
	ctx := context.Background()
	tx, err := f.pool.Begin(ctx)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { _ = tx.Rollback(ctx) })
	if _, err := tx.Exec(ctx, `SELECT 1 FROM outbox_items WHERE id = $1 FOR `+mode, id); err != nil {
		f.t.Fatal(err)
	}
	return func() {
		if err := tx.Rollback(ctx); err != nil {
			f.t.Fatal(err)
		}
	}
}

func (f *storeFixture) get(id int64) outbox.Row {
	f.t.Helper()
	r, err := outbox.Get(context.Background(), f.pool, id)
	if err != nil {
		f.t.Fatal(err)
	}
	return r
}

// recordOutcome writes one record (a batch of one, taking nothing). A fenced update of zero rows returns
// outbox.ErrStaleLease (the attempt row says stale_lease; nothing else
// changed).
func recordOutcome(ctx context.Context, db DB, r record) error {
	errs, _, err := recordOutcomes(ctx, db, r.Now, []record{r}, 0, 0)
	if err != nil {
		return err
	}
	return errs[0]
}

// TestClaimTransitions: pending → leased (token+1, attempts+1,
// first_attempt_at, lease from the given clock); leased (live) not
// claimable; leased (expired) → leased with a new token; and every verdict
// of a message that is not claimed.
func TestClaimTransitions(t *testing.T) {
	t.Parallel()
	f := newStore(t)
	row := f.stage("event:1")

	r := f.claim(row, f.now)
	if r.Verdict != verdictClaimed || r.Item.LeaseToken != 1 || r.Item.Attempts != 1 ||
		!r.Item.FirstAttemptAt.Equal(f.now) || !r.Item.LeaseExpiresAt.Equal(f.now.Add(time.Minute)) {
		t.Fatalf("first claim %+v", r)
	}
	if *r.Item.Ctx.StripeCustomer != "cus_s" || *r.Item.Ctx.MeterID != "mtr_1" || *r.Item.Ctx.CurrentMappingVersion != 1 {
		t.Fatalf("context %+v", r.Item.Ctx)
	}
	if got := f.claim(row, f.now.Add(30*time.Second)); got.Verdict != verdictLeasedLive {
		t.Fatalf("live lease: %v", got.Verdict)
	}
	// expired → reclaimed with a new token; first_attempt_at kept
	r2 := f.claim(row, f.now.Add(61*time.Second))
	if r2.Verdict != verdictClaimed || r2.Item.LeaseToken != 2 || r2.Item.Attempts != 2 || !r2.Item.FirstAttemptAt.Equal(f.now) {
		t.Fatalf("reclaim %+v", r2)
	}
	// the reclaim closed the silent holder's attempt (a killed worker never would)
	var closed, code string
	if err := f.pool.QueryRow(context.Background(), `SELECT outcome, error_code FROM outbox_attempts WHERE item_id = $1 AND lease_token = 1`, row.ID).Scan(&closed, &code); err != nil ||
		closed != "stale_lease" || code != "lease_taken_over" {
		t.Fatalf("attempt 1 after the reclaim: %q %q %v", closed, code, err)
	}
	// the first holder's write is stale; the attempt row says so
	err := recordOutcome(context.Background(), f.pool, record{Item: r.Item, Outcome: OutcomeAccepted})
	if !errors.Is(err, outbox.ErrStaleLease) {
		t.Fatalf("stale write: %v", err)
	}
	var oc string
	if err := f.pool.QueryRow(context.Background(), `SELECT outcome FROM outbox_attempts WHERE item_id = $1 AND lease_token = 1`, row.ID).Scan(&oc); err != nil || oc != "stale_lease" {
		t.Fatalf("attempt 1 outcome %q %v", oc, err)
	}
	if f.get(row.ID).State != outbox.StateLeased {
		t.Fatal("stale write moved the item")
	}
	// leased → pending (retry): fenced, dispatch + 1, next_attempt_at = now + delay
	at := f.now.Add(62 * time.Second)
	if err := recordOutcome(context.Background(), f.pool, record{Now: &at, Item: r2.Item, Outcome: OutcomeRetry, RetryDelay: 10 * time.Second, LastError: "server_error"}); err != nil {
		t.Fatal(err)
	}
	p := f.get(row.ID)
	if p.State != outbox.StatePending || p.Dispatch != 2 || !p.NextAttemptAt.Equal(at.Add(10*time.Second)) || p.LeaseExpiresAt != nil || *p.LastError != "server_error" {
		t.Fatalf("after retry %+v", p)
	}
	// the old message (dispatch 1) is stale; the new one is not due yet
	if got := f.claim(row, at); got.Verdict != verdictStaleDispatch {
		t.Fatalf("old dispatch: %v", got.Verdict)
	}
	if got := f.claim(p, at.Add(time.Second)); got.Verdict != verdictNotDue || !got.NextAttemptAt.Equal(p.NextAttemptAt) {
		t.Fatalf("not due: %v", got.Verdict)
	}
	// row locked by another transaction (e.g. the relay publishing it)
	tx, err := f.pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(context.Background(), `SELECT 1 FROM outbox_items WHERE id = $1 FOR UPDATE`, row.ID); err != nil {
		t.Fatal(err)
	}
	if got := f.claim(p, at.Add(11*time.Second)); got.Verdict != verdictLocked {
		t.Fatalf("locked: %v", got.Verdict)
	}
	_ = tx.Rollback(context.Background())
	r3 := f.claim(p, at.Add(11*time.Second))
	if r3.Verdict != verdictClaimed || r3.Item.LeaseToken != 3 {
		t.Fatalf("third claim %+v", r3)
	}
	if err := recordOutcome(context.Background(), f.pool, record{Item: r3.Item, Outcome: OutcomeAccepted, Result: Result{ProviderRef: "req_1", HTTPStatus: 200, RequestID: "req_1"}}); err != nil {
		t.Fatal(err)
	}
	if got := f.claim(p, at.Add(12*time.Second)); got.Verdict != verdictTerminal {
		t.Fatalf("terminal: %v", got.Verdict)
	}
	// wrong key / unknown item
	bad := p
	bad.IdempotencyKey = "0000000000000000000000000000000000000000000000000000000000000000"
	if got := f.claim(bad, at); got.Verdict != verdictMismatch {
		t.Fatalf("mismatch: %v", got.Verdict)
	}
	bad.ID = 999
	if got := f.claim(bad, at); got.Verdict != verdictNotFound {
		t.Fatalf("not found: %v", got.Verdict)
	}
}

// TestOutcomeTransitions: leased → accepted | uncertain | rejected |
// quarantined, each fenced; a second write with the same token is stale.
func TestOutcomeTransitions(t *testing.T) {
	t.Parallel()
	f := newStore(t)
	cases := []struct {
		out    Outcome
		reason outbox.Reason
		state  outbox.State
	}{
		{OutcomeAccepted, "", outbox.StateAccepted},
		{OutcomeUncertain, "", outbox.StateUncertain},
		{OutcomeRejected, "", outbox.StateRejected},
		{OutcomeQuarantined, outbox.ReasonCustomerMissing, outbox.StateQuarantined},
	}
	for _, c := range cases {
		row := f.stage("event:" + string(c.out))
		r := f.claim(row, f.now)
		if r.Verdict != verdictClaimed {
			t.Fatalf("%s: %v", c.out, r.Verdict)
		}
		rec := record{Item: r.Item, Outcome: c.out, Reason: c.reason, LastError: "x", Result: Result{ProviderRef: "req_9"}}
		if err := recordOutcome(context.Background(), f.pool, rec); err != nil {
			t.Fatalf("%s: %v", c.out, err)
		}
		got := f.get(row.ID)
		if got.State != c.state || (c.reason != "" && *got.QuarantineReason != c.reason) {
			t.Fatalf("%s: %+v", c.out, got)
		}
		if (c.out == OutcomeAccepted) != (got.ProviderRef != nil) {
			t.Fatalf("%s: provider_ref %v", c.out, got.ProviderRef)
		}
		if err := recordOutcome(context.Background(), f.pool, rec); !errors.Is(err, outbox.ErrStaleLease) {
			t.Fatalf("%s: second write %v", c.out, err)
		}
	}
}

// TestDeliverySlot: a second item for the same (account, customer, meter)
// is not claimed while the first holds the slot; it is once the slot is
// freed by the outcome write or expires with the lease.
func TestDeliverySlot(t *testing.T) {
	t.Parallel()
	f := newStore(t)
	a, b := f.stage("event:a"), f.stage("event:b")
	ra := f.claim(a, f.now)
	if ra.Verdict != verdictClaimed {
		t.Fatal(ra.Verdict)
	}
	if got := f.claim(b, f.now); got.Verdict != verdictSlotBusy {
		t.Fatalf("slot busy: %v", got.Verdict)
	}
	if got := f.get(b.ID); got.State != outbox.StatePending || got.Attempts != 0 {
		t.Fatalf("a busy slot must not claim: %+v", got)
	}
	if err := recordOutcome(context.Background(), f.pool, record{Item: ra.Item, Outcome: OutcomeAccepted}); err != nil {
		t.Fatal(err)
	}
	rb := f.claim(b, f.now)
	if rb.Verdict != verdictClaimed {
		t.Fatalf("after release: %v", rb.Verdict)
	}
	c := f.stage("event:c")
	if got := f.claim(c, f.now.Add(30*time.Second)); got.Verdict != verdictSlotBusy {
		t.Fatalf("live slot: %v", got.Verdict)
	}
	if got := f.claim(c, f.now.Add(61*time.Second)); got.Verdict != verdictClaimed {
		t.Fatalf("expired slot: %v", got.Verdict)
	}
	// An item without a customer takes no slot and is still claimed (it
	// will be quarantined customer_missing).
	f.exec(`UPDATE tenant_billing SET stripe_customer = NULL`)
	d := f.stage("event:d")
	if got := f.claim(d, f.now); got.Verdict != verdictClaimed || got.Item.hasSlot() {
		t.Fatalf("no customer: %+v", got)
	}
}

// TestClaimBatch: one statement claims many items; two items of the same
// (account, customer, meter) in one batch get one slot between them; the
// outcome batch frees the slots and fences each row.
func TestClaimBatch(t *testing.T) {
	t.Parallel()
	f := newStore(t)
	f.exec(`INSERT INTO tenant_billing (tenant, destination_account, stripe_customer) VALUES ('org_t', 'acct_s', 'cus_t')`)
	a, b := f.stage("event:a"), f.stage("event:b")
	var c outbox.Row
	err := pgx.BeginFunc(context.Background(), f.pool, func(tx pgx.Tx) error {
		var err error
		c, err = outbox.Stage(context.Background(), tx, outbox.Item{
			Identity: identity.Identity{Tenant: "org_t", SubjectKind: identity.SubjectEvent, SubjectRef: "event:c",
				Exporter: outbox.DefaultExporter, DestinationAccount: "acct_s", Mode: identity.ModeTest, MappingVersion: 1},
			Feature: "api_calls", Quantity: 1, OccurredAt: f.now,
		})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	ps := []claimParams{}
	for _, r := range []outbox.Row{b, a, c} {
		ps = append(ps, claimParams{ItemID: r.ID, Dispatch: r.Dispatch, Key: r.IdempotencyKey})
	}
	rs, err := claimItems(context.Background(), f.pool, &f.now, outbox.DefaultExporter, time.Minute, ps)
	if err != nil {
		t.Fatal(err)
	}
	// b and a share the slot: the lower id (a) wins it; c has its own.
	if rs[0].Verdict != verdictSlotBusy || rs[1].Verdict != verdictClaimed || rs[2].Verdict != verdictClaimed {
		t.Fatalf("verdicts %v %v %v", rs[0].Verdict, rs[1].Verdict, rs[2].Verdict)
	}
	stale := rs[1].Item
	stale.LeaseToken = 99
	errs, _, err := recordOutcomes(context.Background(), f.pool, &f.now, []record{
		{Item: rs[1].Item, Outcome: OutcomeAccepted},
		{Item: rs[2].Item, Outcome: OutcomeRetry, RetryDelay: time.Second},
	}, 100, time.Minute)
	if err != nil || errs[0] != nil || errs[1] != nil {
		t.Fatalf("%v %v", errs, err)
	}
	if got := f.claim(b, f.now); got.Verdict != verdictClaimed {
		t.Fatalf("b after a freed the slot: %v", got.Verdict)
	}
	errs, _, err = recordOutcomes(context.Background(), f.pool, &f.now, []record{{Item: stale, Outcome: OutcomeAccepted}}, 100, time.Minute)
	if err != nil || !errors.Is(errs[0], outbox.ErrStaleLease) {
		t.Fatalf("stale in batch: %v %v", errs, err)
	}
}

// TestClaimGroup: the items of one group (a lane's messages handled
// together) share the delivery slot its lowest item takes; an item of the
// same (account, customer, meter) in another group of the same batch finds
// the slot busy; the slot is freed when the group's outcomes are recorded.
func TestClaimGroup(t *testing.T) {
	t.Parallel()
	f := newStore(t)
	a, b, c := f.stage("event:a"), f.stage("event:b"), f.stage("event:c")
	params := func(group int64, rows ...outbox.Row) []claimParams {
		var ps []claimParams
		for _, r := range rows {
			ps = append(ps, claimParams{ItemID: r.ID, Dispatch: r.Dispatch, Key: r.IdempotencyKey, Group: group})
		}
		return ps
	}
	ps := append(params(7, b, a), params(8, c)...)
	rs, err := claimItems(context.Background(), f.pool, &f.now, outbox.DefaultExporter, time.Minute, ps)
	if err != nil {
		t.Fatal(err)
	}
	if rs[0].Verdict != verdictClaimed || rs[1].Verdict != verdictClaimed || rs[2].Verdict != verdictSlotBusy {
		t.Fatalf("verdicts %v %v %v, want claimed claimed slot_busy", rs[0].Verdict, rs[1].Verdict, rs[2].Verdict)
	}
	var holder int64
	if err := f.pool.QueryRow(context.Background(), `SELECT item_id FROM delivery_slots WHERE stripe_customer = 'cus_s'`).Scan(&holder); err != nil {
		t.Fatal(err)
	}
	if holder != a.ID {
		t.Fatalf("slot held by item %d, want the group's lowest item %d", holder, a.ID)
	}
	// Another group cannot take the slot while the group holds it.
	if got := f.claim(c, f.now); got.Verdict != verdictSlotBusy {
		t.Fatalf("c while the group holds the slot: %v", got.Verdict)
	}
	errs, _, err := recordOutcomes(context.Background(), f.pool, &f.now, []record{
		{Item: rs[0].Item, Outcome: OutcomeAccepted},
		{Item: rs[1].Item, Outcome: OutcomeAccepted},
	}, 100, time.Minute)
	if err != nil || errs[0] != nil || errs[1] != nil {
		t.Fatalf("%v %v", errs, err)
	}
	if got := f.claim(c, f.now); got.Verdict != verdictClaimed {
		t.Fatalf("c after the group was recorded: %v", got.Verdict)
	}
}

// TestHandOff: a loser leaves its items with the live holder of the slot;
// the holder's outcome write frees the slot and returns them (and clears the
// list); a free or expired slot refuses them; whoever takes an expired slot
// over inherits its list; the list is bounded.
func TestHandOff(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newStore(t)
	a, b, c := f.stage("event:a"), f.stage("event:b"), f.stage("event:c")
	msg := func(r outbox.Row) outbox.Message {
		return outbox.Message{ItemID: r.ID, Key: r.IdempotencyKey, Dispatch: r.Dispatch, Feature: "api_calls"}
	}
	next := func(m outbox.Message) outbox.Message { m.Dispatch++; return m }
	const lease = time.Minute
	ra := f.claim(a, f.now)
	rb := f.claim(b, f.now)
	if ra.Verdict != verdictClaimed || rb.Verdict != verdictSlotBusy {
		t.Fatalf("verdicts %v %v", ra.Verdict, rb.Verdict)
	}
	want := slotKey{Account: "acct_s", Customer: "cus_s", Meter: "mtr_1"}
	if rb.Slot == nil || *rb.Slot != want {
		t.Fatalf("busy slot: %+v", rb.Slot)
	}
	if ok, err := handOff(ctx, f.pool, &f.now, want, []outbox.Message{msg(b)}, 1); err != nil || !ok {
		t.Fatalf("hand-off to a live holder: %v %v", ok, err)
	}
	if ok, err := handOff(ctx, f.pool, &f.now, want, []outbox.Message{msg(c)}, 1); err != nil || ok {
		t.Fatalf("a full list must refuse: %v %v", ok, err)
	}
	errs, handed, err := recordOutcomes(ctx, f.pool, &f.now, []record{{Item: ra.Item, Outcome: OutcomeAccepted}}, 100, lease)
	if err != nil || errs[0] != nil {
		t.Fatal(err, errs)
	}
	// The take gives the item its next dispatch, unpublished and due one
	// lease later (migration 00017): if the taker died now, the relay would
	// publish it then.
	if len(handed[0]) != 1 || handed[0][0] != next(msg(b)) {
		t.Fatalf("handed back to the holder: %+v", handed)
	}
	if got := f.get(b.ID); got.State != outbox.StatePending || got.Dispatch != b.Dispatch+1 || got.PublishedDispatch != 0 ||
		!got.NextAttemptAt.Equal(f.now.Add(lease)) {
		t.Fatalf("taken item: %+v", got)
	}
	if ok, err := handOff(ctx, f.pool, &f.now, want, []outbox.Message{msg(c)}, 10); err != nil || ok {
		t.Fatalf("a free slot must refuse: %v %v", ok, err)
	}
	// The old message no longer claims it; the handed one does, before its
	// next_attempt_at, and the claim keeps the dispatch the take gave.
	if rs := f.claim(b, f.now); rs.Verdict == verdictClaimed {
		t.Fatal("the handed-off message's dispatch still claims the taken item")
	}
	rb, err = claimItem(ctx, f.pool, claimParams{Now: &f.now, ItemID: b.ID, Dispatch: b.Dispatch + 1, Exporter: b.Exporter,
		Key: b.IdempotencyKey, Lease: lease, Handed: true})
	if err != nil || rb.Verdict != verdictClaimed {
		t.Fatalf("claim the taken item: %v %v", rb.Verdict, err)
	}
	if got := f.get(b.ID); got.State != outbox.StateLeased || got.Dispatch != b.Dispatch+1 {
		t.Fatalf("claimed taken item: %+v", got)
	}

	// The holder dies with a list: the takeover inherits it.
	if ok, err := handOff(ctx, f.pool, &f.now, want, []outbox.Message{msg(c)}, 10); err != nil || !ok {
		t.Fatalf("hand-off: %v %v", ok, err)
	}
	late := f.now.Add(61 * time.Second) // b's one-minute lease (and slot) expired
	if ok, err := handOff(ctx, f.pool, &late, want, []outbox.Message{msg(a)}, 10); err != nil || ok {
		t.Fatalf("an expired slot must refuse: %v %v", ok, err)
	}
	d0 := f.stage("event:d0")
	rd0 := f.claim(d0, late)
	if rd0.Verdict != verdictClaimed {
		t.Fatal(rd0.Verdict)
	}
	_, handed, err = recordOutcomes(ctx, f.pool, &late, []record{{Item: rd0.Item, Outcome: OutcomeAccepted}}, 100, lease)
	if err != nil || len(handed[0]) != 1 || handed[0][0] != next(msg(c)) {
		t.Fatalf("inherited list: %+v %v", handed, err)
	}
	// A release takes at most `take` messages, oldest first; the rest wait
	// for the next release. An entry whose item is no longer pending at its
	// dispatch (a is accepted) is dropped by the take, not returned.
	d1, d2 := f.stage("event:d1"), f.stage("event:d2")
	rd1 := f.claim(d1, late)
	if rd1.Verdict != verdictClaimed {
		t.Fatal(rd1.Verdict)
	}
	if ok, err := handOff(ctx, f.pool, &late, want, []outbox.Message{msg(d2), msg(a)}, 10); err != nil || !ok {
		t.Fatalf("hand-off: %v %v", ok, err)
	}
	_, handed, err = recordOutcomes(ctx, f.pool, &late, []record{{Item: rd1.Item, Outcome: OutcomeAccepted}}, 1, lease)
	if err != nil || len(handed[0]) != 1 || handed[0][0] != next(msg(d2)) {
		t.Fatalf("bounded take: %+v %v", handed, err)
	}
	var left int
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM delivery_slot_waiting`).Scan(&left); err != nil || left != 1 {
		t.Fatalf("left waiting: %d %v", left, err)
	}
	rd3 := f.claim(f.stage("event:d3"), late)
	if rd3.Verdict != verdictClaimed {
		t.Fatal(rd3.Verdict)
	}
	_, handed, err = recordOutcomes(ctx, f.pool, &late, []record{{Item: rd3.Item, Outcome: OutcomeAccepted}}, 100, lease)
	if err != nil || len(handed[0]) != 0 {
		t.Fatalf("an accepted item's entry must be dropped: %+v %v", handed, err)
	}
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM delivery_slot_waiting`).Scan(&left); err != nil || left != 0 {
		t.Fatalf("left waiting: %d %v", left, err)
	}

	// Requeue: a taken item this process will not claim is due now (the
	// relay publishes its new dispatch); one whose dispatch moved on, or
	// that is not pending, is left alone.
	if n, err := requeue(ctx, f.pool, &late, []outbox.Message{next(msg(d2)), msg(d1)}); err != nil || n != 1 {
		t.Fatalf("requeue: %d %v", n, err)
	}
	if got := f.get(d2.ID); got.Dispatch != d2.Dispatch+1 || got.State != outbox.StatePending || !got.NextAttemptAt.Equal(late) {
		t.Fatalf("requeued: %+v", got)
	}
	if n, err := requeue(ctx, f.pool, &late, []outbox.Message{msg(d2)}); err != nil || n != 0 {
		t.Fatalf("stale requeue: %d %v", n, err)
	}

	// The slow holder's late write (its own lease was not taken over) still
	// lands, but the slot is no longer its own: it takes nothing.
	errs, handed, err = recordOutcomes(ctx, f.pool, &late, []record{{Item: rb.Item, Outcome: OutcomeAccepted}}, 100, lease)
	if err != nil || errs[0] != nil || len(handed[0]) != 0 {
		t.Fatalf("slow holder: %v %+v %v", errs, handed, err)
	}

	// An item whose lease expired (its holder died) and whose message came
	// back and was handed over is taken too: a new dispatch (the relay
	// publishes it, as any expired lease with an unpublished dispatch), and
	// the taker's handed claim takes it over.
	later := late.Add(2 * lease)
	g := f.stage("event:g")
	rg := f.claim(g, late)
	if rg.Verdict != verdictClaimed {
		t.Fatal(rg.Verdict)
	}
	// (rg holds the slot; its lease expires at late+lease: dead.)
	holder := f.claim(f.stage("event:h"), later) // takes the expired slot over
	if holder.Verdict != verdictClaimed {
		t.Fatal(holder.Verdict)
	}
	if ok, err := handOff(ctx, f.pool, &later, want, []outbox.Message{msg(g)}, 10); err != nil || !ok {
		t.Fatalf("hand-off of an expired lease's item: %v %v", ok, err)
	}
	_, handed, err = recordOutcomes(ctx, f.pool, &later, []record{{Item: holder.Item, Outcome: OutcomeAccepted}}, 100, lease)
	if err != nil || len(handed[0]) != 1 || handed[0][0] != next(msg(g)) {
		t.Fatalf("expired lease's item: %+v %v", handed, err)
	}
	if got := f.get(g.ID); got.State != outbox.StateLeased || got.Dispatch != g.Dispatch+1 || got.LeaseToken != rg.Item.LeaseToken {
		t.Fatalf("taken expired lease: %+v", got)
	}
	rg2, err := claimItem(ctx, f.pool, claimParams{Now: &later, ItemID: g.ID, Dispatch: g.Dispatch + 1, Exporter: g.Exporter,
		Key: g.IdempotencyKey, Lease: lease, Handed: true})
	if err != nil || rg2.Verdict != verdictClaimed {
		t.Fatalf("claim the taken expired lease: %v %v", rg2.Verdict, err)
	}

	// An item another transaction holds locked (a claim waiting for this
	// very slot, say) is not waited for: its entry stays for the next take.
	k := f.stage("event:k")
	if ok, err := handOff(ctx, f.pool, &later, want, []outbox.Message{msg(k)}, 10); err != nil || !ok {
		t.Fatalf("hand-off: %v %v", ok, err)
	}
	release := f.lockItem(k.ID, "UPDATE")
	_, handed, err = recordOutcomes(ctx, f.pool, &later, []record{{Item: rg2.Item, Outcome: OutcomeAccepted}}, 100, lease)
	if err != nil || len(handed[0]) != 0 {
		t.Fatalf("a locked item must be skipped: %+v %v", handed, err)
	}
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM delivery_slot_waiting`).Scan(&left); err != nil || left != 1 {
		t.Fatalf("the locked item's entry must stay: %d %v", left, err)
	}
	release()
	rl := f.claim(f.stage("event:l"), later)
	if rl.Verdict != verdictClaimed {
		t.Fatal(rl.Verdict)
	}
	_, handed, err = recordOutcomes(ctx, f.pool, &later, []record{{Item: rl.Item, Outcome: OutcomeAccepted}}, 100, lease)
	if err != nil || len(handed[0]) != 1 || handed[0][0] != next(msg(k)) {
		t.Fatalf("the next take: %+v %v", handed, err)
	}

	// A key-share lock (a foreign-key check: an attempt, a usage event or a
	// recovery action naming the item) does not make the take skip it.
	m := f.stage("event:m")
	rn := f.claim(f.stage("event:n"), later)
	if rn.Verdict != verdictClaimed {
		t.Fatal(rn.Verdict)
	}
	if ok, err := handOff(ctx, f.pool, &later, want, []outbox.Message{msg(m)}, 10); err != nil || !ok {
		t.Fatalf("hand-off: %v %v", ok, err)
	}
	release = f.lockItem(m.ID, "KEY SHARE")
	_, handed, err = recordOutcomes(ctx, f.pool, &later, []record{{Item: rn.Item, Outcome: OutcomeAccepted}}, 100, lease)
	if err != nil || len(handed[0]) != 1 || handed[0][0] != next(msg(m)) {
		t.Fatalf("a key-share lock must not make the take skip: %+v %v", handed, err)
	}
	release()

	// An entry naming an item of the outcome write itself (a handed copy of
	// an item being recorded) or no item at all is dropped, never taken.
	p := f.stage("event:p")
	rp := f.claim(p, later)
	if rp.Verdict != verdictClaimed {
		t.Fatal(rp.Verdict)
	}
	if ok, err := handOff(ctx, f.pool, &later, want, []outbox.Message{msg(p), {ItemID: 1 << 40, Key: p.IdempotencyKey, Dispatch: 1}}, 10); err != nil || !ok {
		t.Fatalf("hand-off: %v %v", ok, err)
	}
	// Recorded late, past its lease (nobody took it over): the entry names
	// an expired lease, which the take would otherwise give a new dispatch
	// in the statement that records it.
	late2 := later.Add(2 * lease)
	errs, handed, err = recordOutcomes(ctx, f.pool, &late2, []record{{Item: rp.Item, Outcome: OutcomeAccepted}}, 100, lease)
	if err != nil || errs[0] != nil || len(handed[0]) != 0 {
		t.Fatalf("own item and missing item: %v %+v %v", errs, handed, err)
	}
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM delivery_slot_waiting`).Scan(&left); err != nil || left != 0 {
		t.Fatalf("left waiting: %d %v", left, err)
	}
	if got := f.get(p.ID); got.State != outbox.StateAccepted || got.Dispatch != p.Dispatch {
		t.Fatalf("recorded item: %+v", got)
	}
}

// TestHandedClaimOfLockedItem: a handed claim does not wait for
// next_attempt_at (the take set it one lease ahead), so a pending item it
// does not get was locked by someone else: verdict locked (retried within
// milliseconds), not not_due (requeued through the relay).
func TestHandedClaimOfLockedItem(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newStore(t)
	x := f.stage("event:x")
	f.exec(`UPDATE outbox_items SET dispatch = 2, next_attempt_at = $2::timestamptz + interval '1 minute' WHERE id = $1`, x.ID, f.now)
	release := f.lockItem(x.ID, "UPDATE")
	p := claimParams{Now: &f.now, ItemID: x.ID, Dispatch: 2, Exporter: x.Exporter, Key: x.IdempotencyKey, Lease: time.Minute, Handed: true}
	if r, err := claimItem(ctx, f.pool, p); err != nil || r.Verdict != verdictLocked {
		t.Fatalf("locked handed item: %v %v", r.Verdict, err)
	}
	p.Handed = false
	if r, err := claimItem(ctx, f.pool, p); err != nil || r.Verdict != verdictNotDue {
		t.Fatalf("the same row by a message: %v %v", r.Verdict, err)
	}
	release()
	p.Handed = true
	if r, err := claimItem(ctx, f.pool, p); err != nil || r.Verdict != verdictClaimed {
		t.Fatalf("unlocked handed item: %v %v", r.Verdict, err)
	}
}
