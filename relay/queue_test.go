package relay

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/shared/clock"
	"github.com/aurora-billing/aurora/shared/natstest"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
)

// queued returns the dispatches outbox_publish_queue holds for an item,
// with their due times, in due order.
func queued(t testing.TB, pool *pgxpool.Pool, id int64) (dispatches []int32, dues []time.Time) {
	t.Helper()
	rows, err := pool.Query(context.Background(),
		`SELECT dispatch, due_at FROM outbox_publish_queue WHERE item_id = $1 ORDER BY due_at, dispatch`, id)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var d int32
		var at time.Time
		if err := rows.Scan(&d, &at); err != nil {
			t.Fatal(err)
		}
		dispatches, dues = append(dispatches, d), append(dues, at)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return dispatches, dues
}

// update runs UPDATE outbox_items SET set WHERE id = $1, with now as $2
// when set uses it.
func update(ctx context.Context, pool *pgxpool.Pool, id int64, set string, now time.Time) error {
	args := []any{id}
	if strings.Contains(set, "$2") {
		args = append(args, now)
	}
	_, err := pool.Exec(ctx, `UPDATE outbox_items SET `+set+` WHERE id = $1`, args...)
	return err
}

// batchRelay returns a relay that is not running (tests call its batch
// directly), its database and JetStream, the stream ensured.
func batchRelay(t *testing.T, cfg Config, opts ...Option) (*Relay, *pgxpool.Pool, jetstream.JetStream) {
	t.Helper()
	pool := newPool(t)
	_, js := connect(t, natstest.New(t))
	if _, err := EnsureStream(context.Background(), js, cfg.Stream); err != nil {
		t.Fatal(err)
	}
	r, err := New(pool, js, cfg, append([]Option{WithLogger(quietLogger())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return r, pool, js
}

// One batch judges every due queue row against its item (migration 00308,
// claimDueSQL): what is due and unpublished is published once and marked
// without moving updated_at; what is due later is queued again at the
// item's own due time; what moved on is dropped. Time is a manual clock an
// hour ahead, so every row staged now is due by the queue's reckoning.
func TestPublishQueueVerdicts(t *testing.T) {
	t.Parallel()
	now := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	cases := []struct {
		name      string
		set       string // an UPDATE's SET list for the staged row; $2 is now
		published int32  // the dispatch the batch publishes; 0: none
		queued    []int32
		queuedAt  time.Duration // the due time left in the queue, from now
	}{
		{name: "pending and due", published: 1},
		{name: "pending, due later", set: `next_attempt_at = $2::timestamptz + interval '5 minutes'`,
			queued: []int32{1}, queuedAt: 5 * time.Minute},
		{name: "leased, lease live", set: `state = 'leased', lease_token = 1, lease_expires_at = $2::timestamptz + interval '1 minute'`,
			queued: []int32{1}, queuedAt: time.Minute},
		{name: "leased, lease expired", set: `state = 'leased', lease_token = 1, lease_expires_at = $2::timestamptz - interval '1 second'`,
			published: 1},
		{name: "already published", set: `published_dispatch = 1, published_at = $2`},
		{name: "accepted", set: `state = 'accepted'`},
		{name: "quarantined", set: `state = 'quarantined', quarantine_reason = 'customer_missing'`},
		{name: "moved to dispatch 2", set: `dispatch = 2, next_attempt_at = $2::timestamptz - interval '1 second'`, published: 2},
	}
	r, pool, js := batchRelay(t, testConfig(), WithClock(clock.NewManual(now)))
	ctx := context.Background()
	ids := stage(t, pool, items("org_queue", 0, len(cases))...)
	before := map[int64]time.Time{}
	for i, c := range cases {
		if c.set != "" {
			if err := update(ctx, pool, ids[i], c.set, now); err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
		}
		var at time.Time
		if err := pool.QueryRow(ctx, `SELECT updated_at FROM outbox_items WHERE id = $1`, ids[i]).Scan(&at); err != nil {
			t.Fatal(err)
		}
		before[ids[i]] = at
	}
	for {
		n, err := r.batch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
	}
	sent := map[int64][]int32{}
	for _, m := range streamMsgs(t, js) {
		sent[m.body.ItemID] = append(sent[m.body.ItemID], m.body.Dispatch)
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			id := ids[i]
			switch {
			case c.published == 0 && len(sent[id]) > 0:
				t.Errorf("published %v, want nothing", sent[id])
			case c.published != 0 && (len(sent[id]) != 1 || sent[id][0] != c.published):
				t.Errorf("published %v, want dispatch %d once", sent[id], c.published)
			}
			var pd int32
			var updated time.Time
			if err := pool.QueryRow(ctx, `SELECT published_dispatch, updated_at FROM outbox_items WHERE id = $1`, id).Scan(&pd, &updated); err != nil {
				t.Fatal(err)
			}
			if c.published != 0 && pd != c.published {
				t.Errorf("published_dispatch %d, want %d", pd, c.published)
			}
			if !updated.Equal(before[id]) {
				t.Errorf("updated_at moved from %s to %s: the relay's mark must keep it", before[id], updated)
			}
			ds, dues := queued(t, pool, id)
			if len(ds) != len(c.queued) || (len(ds) == 1 && ds[0] != c.queued[0]) {
				t.Fatalf("queue holds dispatches %v, want %v", ds, c.queued)
			}
			if len(dues) == 1 && !dues[0].Equal(now.Add(c.queuedAt)) {
				t.Errorf("queued again due %s, want %s", dues[0], now.Add(c.queuedAt))
			}
		})
	}
}

// Every path that moves a dispatch or brings an unpublished one forward
// queues it, by trigger; claims and terminal outcomes do not.
func TestPublishQueueTriggers(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Second)
	cases := []struct {
		name string
		set  string
		then string  // a second update, if any
		want []int32 // the dispatches queued after the update(s), in due order
	}{
		{name: "staged", want: []int32{1}},
		{name: "claimed", set: `state = 'leased', lease_token = 1, lease_expires_at = $2::timestamptz + interval '1 minute'`, want: []int32{1}},
		{name: "retry: new dispatch", set: `dispatch = 2, next_attempt_at = $2::timestamptz + interval '1 minute'`, want: []int32{1, 2}},
		{name: "brought forward", set: `next_attempt_at = $2::timestamptz - interval '1 hour'`, want: []int32{1, 1}},
		{name: "moved later", set: `next_attempt_at = $2::timestamptz + interval '1 hour'`, want: []int32{1}},
		{name: "accepted", set: `state = 'accepted', next_attempt_at = $2::timestamptz - interval '1 hour'`, want: []int32{1}},
		{name: "back to pending from quarantined, same dispatch", set: `state = 'quarantined', quarantine_reason = 'customer_missing'`,
			then: `state = 'pending', quarantine_reason = NULL`, want: []int32{1, 1}},
	}
	ids := stage(t, pool, items("org_trig", 0, len(cases))...)
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.set != "" {
				if err := update(ctx, pool, ids[i], c.set, now); err != nil {
					t.Fatal(err)
				}
			}
			if c.then != "" {
				if err := update(ctx, pool, ids[i], c.then, now); err != nil {
					t.Fatal(err)
				}
			}
			got, _ := queued(t, pool, ids[i])
			if len(got) != len(c.want) {
				t.Fatalf("queued %v, want %v", got, c.want)
			}
			for j := range got {
				if got[j] != c.want[j] {
					t.Fatalf("queued %v, want %v", got, c.want)
				}
			}
		})
	}
	// A row staged quarantined is never queued.
	var q outbox.Row
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) (err error) {
		q, err = outbox.Stage(ctx, tx, item("org_trig", len(cases)), outbox.WithQuarantine(outbox.ReasonPeriodBuffered))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := queued(t, pool, q.ID); len(got) != 0 {
		t.Fatalf("a row staged quarantined was queued: %v", got)
	}
}

// A publish that fails leaves the dispatch queued (the batch puts its
// queue row back and commits); the next batch after JetStream is back
// publishes it.
func TestFailedPublishStaysQueued(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	srv := natstest.New(t)
	_, js := connect(t, srv)
	ctx := context.Background()
	cfg := testConfig()
	cfg.PublishTimeoutMS = 300
	r, err := New(pool, js, cfg, WithLogger(quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	ids := stage(t, pool, items("org_fail", 0, 3)...)
	// No stream yet: nothing answers the publishes.
	if _, err := r.batch(ctx); err == nil {
		t.Fatal("a batch with no stream to publish to succeeded")
	}
	for _, id := range ids {
		if got, _ := queued(t, pool, id); len(got) != 1 || got[0] != 1 {
			t.Fatalf("item %d: queued %v after a failed publish, want [1]", id, got)
		}
	}
	if n, err := publishedCount(ctx, pool); err != nil || n != 0 {
		t.Fatalf("%d marked published after a failed publish (%v)", n, err)
	}
	if _, err := EnsureStream(ctx, js, cfg.Stream); err != nil {
		t.Fatal(err)
	}
	r.streamMissing.Store(false)
	if n, err := r.batch(ctx); err != nil || n != 3 {
		t.Fatalf("batch after the stream came back: %d, %v", n, err)
	}
	if n, err := publishedCount(ctx, pool); err != nil || n != 3 {
		t.Fatalf("%d marked published, want 3 (%v)", n, err)
	}
	var left int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_publish_queue`).Scan(&left); err != nil || left != 0 {
		t.Fatalf("%d queue rows left after publishing (%v)", left, err)
	}
}

// A batch reports the queue rows it took, not the items it published: a
// full take of rows whose items moved on keeps the worker going at once
// (relay.work goes on while a batch is full) instead of waiting for the
// next poll with due rows behind them.
func TestFullTakeOfStaleRowsCountsAsFull(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.Outbox.BatchSize = 5
	r, pool, js := batchRelay(t, cfg)
	ctx := context.Background()
	ids := stage(t, pool, items("org_full", 0, 7)...)
	if _, err := pool.Exec(ctx, `UPDATE outbox_items SET state = 'accepted' WHERE id = ANY($1)`, ids[:6]); err != nil {
		t.Fatal(err)
	}
	for i, want := range []int{5, 2, 0} {
		n, err := r.batch(ctx)
		if err != nil || n != want {
			t.Fatalf("batch %d: took %d (%v), want %d", i+1, n, err, want)
		}
	}
	sent := streamMsgs(t, js)
	if len(sent) != 1 || sent[0].body.ItemID != ids[6] {
		t.Fatalf("published %+v, want item %d only", sent, ids[6])
	}
}

// The mark never waits for a row lock (a deliverer's claim or outcome
// write holding the row is what deadlocked with it when it did): a locked
// row is left unmarked and queued again, and the next batch, once the lock
// is gone, judges it afresh and marks it.
func TestMarkSkipsLockedRowsAndQueuesThemAgain(t *testing.T) {
	t.Parallel()
	r, pool, js := batchRelay(t, testConfig())
	ctx := context.Background()
	ids := stage(t, pool, items("org_lock", 0, 2)...)
	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx) //nolint:errcheck // committed below
	if _, err := holder.Exec(ctx, `SELECT id FROM outbox_items WHERE id = $1 FOR UPDATE`, ids[0]); err != nil {
		t.Fatal(err)
	}
	bctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if n, err := r.batch(bctx); err != nil || n != 2 {
		t.Fatalf("batch with a locked row: took %d, %v (want 2, no wait)", n, err)
	}
	var pd0, pd1 int32
	if err := pool.QueryRow(ctx, `SELECT (SELECT published_dispatch FROM outbox_items WHERE id = $1), (SELECT published_dispatch FROM outbox_items WHERE id = $2)`,
		ids[0], ids[1]).Scan(&pd0, &pd1); err != nil {
		t.Fatal(err)
	}
	if pd0 != 0 || pd1 != 1 {
		t.Fatalf("published_dispatch %d (locked row) and %d, want 0 and 1", pd0, pd1)
	}
	if got, _ := queued(t, pool, ids[0]); len(got) != 1 || got[0] != 1 {
		t.Fatalf("the locked row's queue rows: %v, want [1]", got)
	}
	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := r.batch(ctx); err != nil || n != 1 {
		t.Fatalf("batch after the lock: took %d, %v", n, err)
	}
	if err := pool.QueryRow(ctx, `SELECT published_dispatch FROM outbox_items WHERE id = $1`, ids[0]).Scan(&pd0); err != nil || pd0 != 1 {
		t.Fatalf("published_dispatch %d after the lock (%v), want 1", pd0, err)
	}
	if msgs := streamMsgs(t, js); len(msgs) != 2 {
		t.Fatalf("%d messages stored, want 2 (the republish of the same dispatch is dropped as a duplicate)", len(msgs))
	}
}
