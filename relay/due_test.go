package relay

import (
	"context"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/shared/clock"
	"github.com/aurora-billing/aurora/shared/natstest"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/prometheus/client_golang/prometheus"
)

// Only due rows are published: pending rows with a future next_attempt_at,
// leased rows with a live lease and rows in any other state are left alone;
// a leased row whose lease expired is published. Time is the manual clock's.
func TestOnlyDueRowsArePublished(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	_, js := connect(t, natstest.New(t))
	ctx := context.Background()
	now := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	clk := clock.NewManual(now)
	ids := stage(t, pool, items("org_due", 0, 6)...)
	set := func(id int64, sql string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, `UPDATE outbox_items SET `+sql+` WHERE id = $1`, append([]any{id}, args...)...); err != nil {
			t.Fatal(err)
		}
	}
	dueNow, future, leasedLive, leasedExpired, accepted, quarantined := ids[0], ids[1], ids[2], ids[3], ids[4], ids[5]
	set(future, `next_attempt_at = $2`, now.Add(time.Minute))
	set(leasedLive, `state = 'leased', lease_token = 1, lease_expires_at = $2`, now.Add(time.Minute))
	set(leasedExpired, `state = 'leased', lease_token = 1, lease_expires_at = $2`, now.Add(-time.Second))
	set(accepted, `state = 'accepted'`)
	set(quarantined, `state = 'quarantined', quarantine_reason = 'customer_missing'`)

	sweeps := make(chan int, 1024)
	start(t, pool, js, testConfig(), WithClock(clk), withHooks(hooks{afterSweep: func(n int) {
		select {
		case sweeps <- n:
		default:
		}
	}}))
	eventually(t, "due rows published", func() (bool, error) {
		n, err := publishedCount(ctx, pool)
		return n == 2, err
	})
	drain(sweeps)
	<-sweeps // a full poll and sweep cycle later, still only those two
	<-sweeps
	published := map[int64]bool{}
	for _, m := range streamMsgs(t, js) {
		published[m.body.ItemID] = true
	}
	if len(published) != 2 || !published[dueNow] || !published[leasedExpired] {
		t.Fatalf("published %v, want exactly %d (due) and %d (expired lease)", published, dueNow, leasedExpired)
	}

	clk.Advance(2 * time.Minute) // the future row and the live lease become due
	eventually(t, "rows published once due", func() (bool, error) {
		n, err := publishedCount(ctx, pool)
		return n == 4, err
	})
	for _, id := range []int64{accepted, quarantined} {
		if r, err := outbox.Get(ctx, pool, id); err != nil || r.PublishedDispatch != 0 {
			t.Fatalf("row %d (%s) published: %+v %v", id, r.State, r, err)
		}
	}
}

// A deliverer's retry (leased → pending, next_attempt_at in the future,
// dispatch+1) is published as the new dispatch once due, under a new
// Nats-Msg-Id, not dropped as a duplicate of the first.
func TestRetryIsPublishedAsNewDispatchWhenDue(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	_, js := connect(t, natstest.New(t))
	ctx := context.Background()
	clk := clock.NewManual(time.Now().Add(time.Hour))
	reg := prometheus.NewRegistry()
	start(t, pool, js, testConfig(), WithClock(clk), WithRegistry(reg))
	id := stage(t, pool, item("org_retry", 1))[0]
	eventually(t, "dispatch 1 published", func() (bool, error) {
		r, err := outbox.Get(ctx, pool, id)
		return r.PublishedDispatch == 1, err
	})
	if _, err := pool.Exec(ctx, `UPDATE outbox_items SET dispatch = dispatch + 1, next_attempt_at = $2, attempts = 1 WHERE id = $1`,
		id, clk.Now().Add(30*time.Second)); err != nil {
		t.Fatal(err)
	}
	clk.Advance(31 * time.Second)
	eventually(t, "dispatch 2 published", func() (bool, error) {
		r, err := outbox.Get(ctx, pool, id)
		return r.PublishedDispatch == 2, err
	})
	msgs := streamMsgs(t, js)
	if len(msgs) != 2 || msgs[0].body.Dispatch != 1 || msgs[1].body.Dispatch != 2 || msgs[1].msgID != outbox.MsgID(msgs[1].body.Key, 2) {
		t.Fatalf("stream %+v, want dispatch 1 then 2", msgs)
	}
	if v, _ := counterValue(reg, "aurora_relay_duplicates_total"); v != 0 {
		t.Fatalf("duplicates %v, want 0", v)
	}
}

// The re-dispatch rule, row by row, by the manual clock: a row gets
// dispatch+1 when it was published for its current dispatch more than the
// interval ago and has been due for more than the interval (pending since
// next_attempt_at, leased since its lease expired). A second sweep bumps
// nothing: the bumped rows now need publishing, not re-dispatch.
func TestRedispatchRule(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	_, js := connect(t, natstest.New(t))
	ctx := context.Background()
	now := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	clk := clock.NewManual(now)
	cfg := testConfig()
	r, err := New(pool, js, cfg, WithClock(clk), WithLogger(quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		set    string // SET clause; $2 = now
		bumped bool
	}{
		{"pending, due and published past the interval", `next_attempt_at = $2::timestamptz - interval '400 s', published_dispatch = 1, published_at = $2::timestamptz - interval '301 s'`, true},
		{"pending, published inside the interval", `next_attempt_at = $2::timestamptz - interval '400 s', published_dispatch = 1, published_at = $2::timestamptz - interval '299 s'`, false},
		{"pending, due only inside the interval", `next_attempt_at = $2::timestamptz - interval '100 s', published_dispatch = 1, published_at = $2::timestamptz - interval '400 s'`, false},
		{"pending, not due", `next_attempt_at = $2::timestamptz + interval '10 s', published_dispatch = 1, published_at = $2::timestamptz - interval '1000 s'`, false},
		{"pending, never published", `next_attempt_at = $2::timestamptz - interval '1000 s'`, false},
		{"leased, expired past the interval", `state = 'leased', lease_token = 1, lease_expires_at = $2::timestamptz - interval '301 s', published_dispatch = 1, published_at = $2::timestamptz - interval '1000 s'`, true},
		{"leased, expired inside the interval", `state = 'leased', lease_token = 1, lease_expires_at = $2::timestamptz - interval '10 s', published_dispatch = 1, published_at = $2::timestamptz - interval '1000 s'`, false},
		{"leased, live lease", `state = 'leased', lease_token = 1, lease_expires_at = $2::timestamptz + interval '60 s', published_dispatch = 1, published_at = $2::timestamptz - interval '1000 s'`, false},
		{"accepted", `state = 'accepted', next_attempt_at = $2::timestamptz - interval '1000 s', published_dispatch = 1, published_at = $2::timestamptz - interval '1000 s'`, false},
	}
	ids := stage(t, pool, items("org_rule", 0, len(cases))...)
	for i, c := range cases {
		if _, err := pool.Exec(ctx, `UPDATE outbox_items SET `+c.set+` WHERE id = $1`, ids[i], now); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
	}
	n, err := r.sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := 0
	for i, c := range cases {
		row, err := outbox.Get(ctx, pool, ids[i])
		if err != nil {
			t.Fatal(err)
		}
		if got := row.Dispatch == 2; got != c.bumped {
			t.Errorf("%s: dispatch %d, bumped %v, want %v", c.name, row.Dispatch, got, c.bumped)
		}
		if c.bumped {
			want++
		}
	}
	if n != want {
		t.Fatalf("sweep reported %d, want %d", n, want)
	}
	if n, err := r.sweep(ctx); err != nil || n != 0 {
		t.Fatalf("second sweep bumped %d (err %v), want 0", n, err)
	}
}
