package deliverer

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

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
	rs, err := claimItems(context.Background(), f.pool, claimParams{Now: &at, Exporter: row.Exporter, Lease: time.Minute,
		Items: []claimRequest{{ItemID: row.ID, Dispatch: row.Dispatch, Key: row.IdempotencyKey}}})
	if err != nil {
		f.t.Fatal(err)
	}
	return rs[0]
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

// recordOutcome writes one record (a batch of one) at now (nil: the
// database's clock). A fenced update of zero rows returns
// outbox.ErrStaleLease (the attempt row says stale_lease; nothing else
// changed).
func recordOutcome(ctx context.Context, db DB, now *time.Time, r record) error {
	errs, err := recordOutcomes(ctx, db, recordParams{Now: now, Records: []record{r}})
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
	err := recordOutcome(context.Background(), f.pool, nil, record{Item: r.Item, Outcome: OutcomeAccepted})
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
	if err := recordOutcome(context.Background(), f.pool, &at, record{Item: r2.Item, Outcome: OutcomeRetry, RetryDelay: 10 * time.Second, LastError: "server_error"}); err != nil {
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
	if err := recordOutcome(context.Background(), f.pool, nil, record{Item: r3.Item, Outcome: OutcomeAccepted, Result: Result{ProviderRef: "req_1", HTTPStatus: 200, RequestID: "req_1"}}); err != nil {
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
		if err := recordOutcome(context.Background(), f.pool, nil, rec); err != nil {
			t.Fatalf("%s: %v", c.out, err)
		}
		got := f.get(row.ID)
		if got.State != c.state || (c.reason != "" && *got.QuarantineReason != c.reason) {
			t.Fatalf("%s: %+v", c.out, got)
		}
		if (c.out == OutcomeAccepted) != (got.ProviderRef != nil) {
			t.Fatalf("%s: provider_ref %v", c.out, got.ProviderRef)
		}
		if err := recordOutcome(context.Background(), f.pool, nil, rec); !errors.Is(err, outbox.ErrStaleLease) {
			t.Fatalf("%s: second write %v", c.out, err)
		}
	}
}

// TestClaimBatch: one statement claims many items, of one lane or several
// (the lane's owner sends them one at a time); the outcome batch fences
// each row.
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
	p := claimParams{Now: &f.now, Exporter: outbox.DefaultExporter, Lease: time.Minute}
	for _, r := range []outbox.Row{b, a, c} {
		p.Items = append(p.Items, claimRequest{ItemID: r.ID, Dispatch: r.Dispatch, Key: r.IdempotencyKey})
	}
	rs, err := claimItems(context.Background(), f.pool, p)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range rs {
		if r.Verdict != verdictClaimed {
			t.Fatalf("request %d: %v", i, r.Verdict)
		}
	}
	if *rs[2].Item.Ctx.StripeCustomer != "cus_t" || *rs[0].Item.Ctx.StripeCustomer != "cus_s" {
		t.Fatalf("send contexts %v %v", *rs[0].Item.Ctx.StripeCustomer, *rs[2].Item.Ctx.StripeCustomer)
	}
	stale := rs[1].Item
	stale.LeaseToken = 99
	errs, err := recordOutcomes(context.Background(), f.pool, recordParams{Now: &f.now, Records: []record{
		{Item: rs[0].Item, Outcome: OutcomeAccepted},
		{Item: stale, Outcome: OutcomeAccepted},
		{Item: rs[2].Item, Outcome: OutcomeRetry, RetryDelay: time.Second},
	}})
	if err != nil || errs[0] != nil || !errors.Is(errs[1], outbox.ErrStaleLease) || errs[2] != nil {
		t.Fatalf("%v %v", errs, err)
	}
	if got := f.get(c.ID); got.State != outbox.StatePending || got.Dispatch != 2 {
		t.Fatalf("retried item %+v", got)
	}
}

// TestRecordTruncatesOnCharacterBoundaries: an error text whose 500th byte
// falls inside a multi-byte character is cut before that character, so the
// batch it is in (with unrelated items) is written.
func TestRecordTruncatesOnCharacterBoundaries(t *testing.T) {
	t.Parallel()
	f := newStore(t)
	a, b := f.stage("event:utf8a"), f.stage("event:utf8b")
	ra, rb := f.claim(a, f.now), f.claim(b, f.now)
	long := strings.Repeat("x", lastErrorMax-1) + "€ tail" // "€" is 3 bytes, straddling byte 500
	errs, err := recordOutcomes(context.Background(), f.pool, recordParams{Now: &f.now, Records: []record{
		{Item: ra.Item, Outcome: OutcomeRetry, RetryDelay: time.Second, LastError: long, Result: Result{Message: long + "\xff"}},
		{Item: rb.Item, Outcome: OutcomeAccepted},
	}})
	if err != nil || errs[0] != nil || errs[1] != nil {
		t.Fatalf("batch refused: %v %v", errs, err)
	}
	got := f.get(a.ID)
	if got.LastError == nil || len(*got.LastError) != lastErrorMax-1 || !utf8.ValidString(*got.LastError) {
		t.Fatalf("last_error %d bytes", len(*got.LastError))
	}
	if f.get(b.ID).State != outbox.StateAccepted {
		t.Fatal("the unrelated item of the batch was not written")
	}
}

// TestDeferHandsSurplusToTheRelay: a deferral moves a pending row of the
// message's dispatch to the next dispatch, due after the delay (unpublished,
// so the relay publishes it then), and leaves leased rows and rows of
// another dispatch alone.
func TestDeferHandsSurplusToTheRelay(t *testing.T) {
	t.Parallel()
	f := newStore(t)
	a, b, c := f.stage("event:da"), f.stage("event:db"), f.stage("event:dc")
	f.exec(`UPDATE outbox_items SET published_dispatch = dispatch, published_at = now() WHERE id IN ($1, $2, $3)`, a.ID, b.ID, c.ID)
	f.claim(b, f.now) // b is leased
	moved, err := deferItems(context.Background(), f.pool, deferParams{Now: &f.now, Items: []deferRequest{
		{ItemID: a.ID, Dispatch: a.Dispatch, Delay: 3 * time.Second},
		{ItemID: b.ID, Dispatch: b.Dispatch, Delay: 3 * time.Second},
		{ItemID: c.ID, Dispatch: c.Dispatch + 1, Delay: 3 * time.Second},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if !moved[a.ID] || moved[b.ID] || moved[c.ID] {
		t.Fatalf("moved %v", moved)
	}
	got := f.get(a.ID)
	if got.State != outbox.StatePending || got.Dispatch != 2 || got.PublishedDispatch != 1 || !got.NextAttemptAt.Equal(f.now.Add(3*time.Second)) {
		t.Fatalf("deferred row %+v", got)
	}
	if got := f.claim(a, f.now.Add(4*time.Second)); got.Verdict != verdictStaleDispatch {
		t.Fatalf("the deferred message's claim: %v", got.Verdict)
	}
}

// TestRecallBringsDeferredRowsForward: a recall makes a deferred row due
// now and wakes the relay's channel; it leaves a row the relay already
// published again, a row at another dispatch and a leased row alone.
func TestRecallBringsDeferredRowsForward(t *testing.T) {
	t.Parallel()
	f := newStore(t)
	a, b, c, e := f.stage("event:ra"), f.stage("event:rb"), f.stage("event:rc"), f.stage("event:re")
	f.exec(`UPDATE outbox_items SET published_dispatch = dispatch, published_at = now() WHERE id IN ($1, $2, $3, $4)`, a.ID, b.ID, c.ID, e.ID)
	var reqs []deferRequest
	for _, r := range []outbox.Row{a, b, c, e} {
		reqs = append(reqs, deferRequest{ItemID: r.ID, Dispatch: r.Dispatch, Delay: time.Minute})
	}
	if moved, err := deferItems(context.Background(), f.pool, deferParams{Now: &f.now, Items: reqs}); err != nil || len(moved) != 4 {
		t.Fatalf("defer: %v %v", moved, err)
	}
	f.exec(`UPDATE outbox_items SET published_dispatch = dispatch WHERE id = $1`, b.ID) // the relay got there first
	c.Dispatch++
	f.claim(c, f.now.Add(2*time.Minute)) // c leased
	listener, err := f.pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Release()
	if _, err := listener.Exec(context.Background(), "LISTEN aurora_outbox"); err != nil {
		t.Fatal(err)
	}
	at := f.now.Add(time.Second)
	n, err := recallItems(context.Background(), f.pool, recallParams{Now: &at, Items: []deferredItem{
		{ID: a.ID, Dispatch: a.Dispatch + 1}, {ID: b.ID, Dispatch: b.Dispatch + 1},
		{ID: c.ID, Dispatch: c.Dispatch}, {ID: e.ID, Dispatch: e.Dispatch + 2},
	}})
	if err != nil || n != 1 {
		t.Fatalf("recall moved %d, %v; want 1", n, err)
	}
	if got := f.get(a.ID); got.State != outbox.StatePending || got.Dispatch != 2 || !got.NextAttemptAt.Equal(at) {
		t.Fatalf("recalled row %+v", got)
	}
	for _, id := range []int64{b.ID, e.ID} {
		if got := f.get(id); !got.NextAttemptAt.Equal(f.now.Add(time.Minute)) {
			t.Fatalf("row %d moved: %+v", id, got)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := listener.Conn().WaitForNotification(ctx); err != nil {
		t.Fatalf("the relay's channel was not notified: %v", err)
	}
	// nothing moved: no notification
	if n, err := recallItems(context.Background(), f.pool, recallParams{Now: &at, Items: []deferredItem{{ID: a.ID, Dispatch: a.Dispatch + 1}}}); err != nil || n != 0 {
		t.Fatalf("second recall moved %d, %v", n, err)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	if nt, err := listener.Conn().WaitForNotification(ctx2); err == nil {
		t.Fatalf("notified although nothing moved: %+v", nt)
	}
}

// TestAdoptFindsTheLanesDeferredRows: adoption returns the rows deferred
// on the item's lane (same tenant, feature, account, exporter), never
// attempted and due later, oldest due first; not a row in a retry's
// backoff, not one already due, not another feature's.
func TestAdoptFindsTheLanesDeferredRows(t *testing.T) {
	t.Parallel()
	f := newStore(t)
	x, a, b, retry, due := f.stage("event:ax"), f.stage("event:aa"), f.stage("event:ab"), f.stage("event:ar"), f.stage("event:ad")
	var other outbox.Row // another feature: another lane
	if err := pgx.BeginFunc(context.Background(), f.pool, func(tx pgx.Tx) error {
		var err error
		other, err = outbox.Stage(context.Background(), tx, outbox.Item{
			Identity: identity.Identity{Tenant: "org_s", SubjectKind: identity.SubjectEvent, SubjectRef: "event:ao",
				Exporter: outbox.DefaultExporter, DestinationAccount: "acct_s", Mode: identity.ModeTest, MappingVersion: 1},
			Feature: "egress_bytes", Quantity: 1, OccurredAt: f.now,
		})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	f.exec(`UPDATE outbox_items SET published_dispatch = dispatch, published_at = now()`)
	if _, err := deferItems(context.Background(), f.pool, deferParams{Now: &f.now, Items: []deferRequest{
		{ItemID: a.ID, Dispatch: a.Dispatch, Delay: 2 * time.Minute},
		{ItemID: b.ID, Dispatch: b.Dispatch, Delay: time.Minute},
		{ItemID: due.ID, Dispatch: due.Dispatch, Delay: 0},
		{ItemID: other.ID, Dispatch: other.Dispatch, Delay: time.Minute},
	}}); err != nil {
		t.Fatal(err)
	}
	f.exec(`UPDATE outbox_items SET attempts = 1, dispatch = dispatch + 1, next_attempt_at = $2 WHERE id = $1`, retry.ID, f.now.Add(time.Minute))
	got, err := adoptItems(context.Background(), f.pool, adoptParams{Now: &f.now, ItemID: x.ID, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	want := []deferredItem{{ID: b.ID, Dispatch: 2}, {ID: a.ID, Dispatch: 2}}
	if !slices.Equal(got, want) {
		t.Fatalf("adopted %+v, want %+v", got, want)
	}
	if got, _ := adoptItems(context.Background(), f.pool, adoptParams{Now: &f.now, ItemID: x.ID, Limit: 1}); len(got) != 1 || got[0].ID != b.ID {
		t.Fatalf("limit 1: %+v", got)
	}
}

// TestEveryColumnHasAWriter: shared/outbox.ColumnWriters names who writes each
// column of outbox_items; a column added without saying so fails here.
func TestEveryColumnHasAWriter(t *testing.T) {
	t.Parallel()
	f := newStore(t)
	rows, err := f.pool.Query(context.Background(), `SELECT column_name FROM information_schema.columns WHERE table_name = 'outbox_items'`)
	if err != nil {
		t.Fatal(err)
	}
	cols, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, c := range cols {
		seen[c] = true
		if outbox.ColumnWriters[c] == "" {
			t.Errorf("outbox_items.%s has no writer in shared/outbox/columns.go", c)
		}
	}
	for c := range outbox.ColumnWriters {
		if !seen[c] {
			t.Errorf("shared/outbox/columns.go names %s, which outbox_items does not have", c)
		}
	}
}
