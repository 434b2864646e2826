package relay

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/shared/clock"
	"github.com/aurora-billing/aurora/shared/natstest"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/prometheus/client_golang/prometheus"
)

// A row whose transaction commits after a higher id's is published once:
// there is no cursor to have moved past it.
func TestRowCommittedAfterHigherIDIsPublished(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	_, js := connect(t, natstest.New(t))
	ctx := context.Background()
	start(t, pool, js, testConfig())

	slow, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Rollback(ctx) //nolint:errcheck
	low, err := outbox.Stage(ctx, slow, item("org_1", 1))
	if err != nil {
		t.Fatal(err)
	}
	high := stage(t, pool, item("org_1", 2))[0]
	if high <= low.ID {
		t.Fatalf("ids %d, %d: want the later commit to hold the higher id", low.ID, high)
	}
	eventually(t, "the higher id published", func() (bool, error) {
		r, err := outbox.Get(ctx, pool, high)
		return r.PublishedDispatch == 1, err
	})
	if err := slow.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the lower id published after its late commit", func() (bool, error) {
		r, err := outbox.Get(ctx, pool, low.ID)
		return r.PublishedDispatch == 1, err
	})
	got := map[int64]int{}
	for _, m := range streamMsgs(t, js) {
		got[m.body.ItemID]++
	}
	if len(got) != 2 || got[low.ID] != 1 || got[high] != 1 {
		t.Fatalf("stream items %v, want each of %d and %d once", got, low.ID, high)
	}
}

// 50 concurrent writers commit (or roll back) after random delays, so ids
// commit out of order: the set of committed rows equals the set of stream
// messages, each once, and no rolled-back row is published.
func TestConcurrentWritersStagedSetEqualsStreamSet(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	_, js := connect(t, natstest.New(t))
	ctx := context.Background()
	cfg := testConfig()
	cfg.Outbox.BatchSize = 25
	start(t, pool, js, cfg)

	const writers, perWriter = 50, 20
	var (
		mu        sync.Mutex
		committed = map[int64]bool{}
		rolled    = map[int64]bool{}
		wg        sync.WaitGroup
		errc      = make(chan error, writers)
	)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for i := 0; i < perWriter; i++ {
				tx, err := pool.Begin(ctx)
				if err != nil {
					errc <- err
					return
				}
				row, err := outbox.Stage(ctx, tx, item(fmt.Sprintf("org_%d", w), i))
				if err != nil {
					_ = tx.Rollback(ctx)
					errc <- err
					return
				}
				time.Sleep(time.Duration(rng.IntN(15)) * time.Millisecond) // random commit delay
				if rng.IntN(10) == 0 {
					if err := tx.Rollback(ctx); err != nil {
						errc <- err
						return
					}
					mu.Lock()
					rolled[row.ID] = true
					mu.Unlock()
					continue
				}
				if err := tx.Commit(ctx); err != nil {
					errc <- err
					return
				}
				mu.Lock()
				committed[row.ID] = true
				mu.Unlock()
			}
		}(w)
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatalf("writer: %v", err)
	}
	eventually(t, "every committed row published", func() (bool, error) {
		n, err := publishedCount(ctx, pool)
		return n == len(committed), err
	})
	msgs := streamMsgs(t, js)
	seen := map[int64]int{}
	for _, m := range msgs {
		seen[m.body.ItemID]++
	}
	for id := range committed {
		if seen[id] != 1 {
			t.Errorf("committed item %d appears %d times in the stream", id, seen[id])
		}
	}
	for id := range seen {
		if !committed[id] {
			t.Errorf("stream holds item %d that was not committed (rolled back: %v)", id, rolled[id])
		}
	}
	if len(msgs) != len(committed) {
		t.Fatalf("stream holds %d messages, %d rows committed", len(msgs), len(committed))
	}
	t.Logf("%d committed, %d rolled back, %d messages", len(committed), len(rolled), len(msgs))
}

var errKilled = errors.New("test: relay killed after PubAck, before marking")

// A relay that dies after its PubAcks but before marking leaves rows
// unpublished in Postgres; the next relay publishes the same dispatch again,
// JetStream drops the copy (duplicate PubAck = success), and the row is
// marked: one copy in the stream.
func TestKilledAfterPubAckBeforeMark(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	nc, js := connect(t, natstest.New(t))
	ctx := context.Background()
	w := tap(t, nc)
	ids := stage(t, pool, items("org_9", 0, 5)...)

	cfg := testConfig()
	cfg.Workers = 1
	first := start(t, pool, js, cfg, withHooks(hooks{afterPublish: func(context.Context, []int64) error { return errKilled }}))
	select {
	case err := <-first.done:
		close(first.done)
		if !errors.Is(err, errKilled) {
			t.Fatalf("first relay ended with %v, want the kill", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("first relay was not killed")
	}
	if n, _ := streamCount(js); n != uint64(len(ids)) {
		t.Fatalf("after the kill the stream holds %d messages, want %d", n, len(ids))
	}
	if n, err := publishedCount(ctx, pool); err != nil || n != 0 {
		t.Fatalf("after the kill %d rows marked (err %v), want 0", n, err)
	}

	reg := prometheus.NewRegistry()
	start(t, pool, js, cfg, WithRegistry(reg))
	eventually(t, "rows marked by the second relay", func() (bool, error) {
		n, err := publishedCount(ctx, pool)
		return n == len(ids), err
	})
	msgs := streamMsgs(t, js)
	if len(msgs) != len(ids) {
		t.Fatalf("stream holds %d messages, want one per row (%d)", len(msgs), len(ids))
	}
	byID, total := w.snapshot()
	if total != 2*len(ids) {
		t.Fatalf("wire saw %d publishes, want %d (each dispatch twice)", total, 2*len(ids))
	}
	for id, n := range byID {
		if n != 2 {
			t.Errorf("msg id %s published %d times, want 2", id, n)
		}
	}
	dup, err := counterValue(reg, "aurora_relay_duplicates_total")
	if err != nil || dup != float64(len(ids)) {
		t.Fatalf("duplicates_total = %v (err %v), want %d", dup, err, len(ids))
	}
}

// Two relays at once publish every row, and no dispatch is published twice:
// the wire (before JetStream's duplicate filter) sees each Nats-Msg-Id once.
func TestTwoRelaysNeverPublishTheSameDispatch(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	srv := natstest.New(t)
	nc, js := connect(t, srv)
	_, jsB := connect(t, srv) // relay B has its own connection, like another process
	ctx := context.Background()
	w := tap(t, nc)
	cfg := testConfig()
	cfg.Outbox.BatchSize = 20
	regA, regB := prometheus.NewRegistry(), prometheus.NewRegistry()
	start(t, pool, js, cfg, WithRegistry(regA))
	start(t, pool, jsB, cfg, WithRegistry(regB))

	const n = 2000
	var wg sync.WaitGroup
	for p := 0; p < 4; p++ {
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			stage(t, pool, items(fmt.Sprintf("org_%d", p), 0, n/4)...)
		}(p)
	}
	wg.Wait()
	eventually(t, "all rows published", func() (bool, error) {
		c, err := publishedCount(ctx, pool)
		return c == n, err
	})
	eventually(t, "the wire saw every publish", func() (bool, error) {
		_, total := w.snapshot()
		return total >= n, nil
	})
	byID, total := w.snapshot()
	for id, c := range byID {
		if c != 1 {
			t.Errorf("msg id %s published %d times", id, c)
		}
	}
	if total != n || len(byID) != n {
		t.Fatalf("wire saw %d publishes of %d ids, want %d of %d", total, len(byID), n, n)
	}
	pa, _ := counterValue(regA, "aurora_relay_published_total")
	pb, _ := counterValue(regB, "aurora_relay_published_total")
	if pa+pb != n {
		t.Fatalf("published %v + %v, want %d", pa, pb, n)
	}
	t.Logf("relay A published %v, relay B %v", pa, pb)
}

// NATS stopped and restarted mid-run: the relay keeps running, backs off,
// reconnects, and everything staged is eventually published, once per
// dispatch in the stream.
func TestNATSRestartMidRun(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	srv := natstest.New(t)
	_, js := connect(t, srv)
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	run := start(t, pool, js, testConfig(), WithRegistry(reg))

	stage(t, pool, items("org_r", 0, 200)...)
	eventually(t, "first rows published", func() (bool, error) {
		c, err := publishedCount(ctx, pool)
		return c > 0, err
	})
	srv.Stop()
	stage(t, pool, items("org_r", 200, 300)...) // staged while NATS is down
	eventually(t, "batches failing against the outage", func() (bool, error) {
		v, err := counterValue(reg, "aurora_relay_batch_errors_total")
		return v > 0, err
	})
	select {
	case err := <-run.done:
		t.Fatalf("relay stopped during the NATS outage: %v", err)
	default:
	}
	srv.Restart()
	stage(t, pool, items("org_r", 500, 100)...)
	eventually(t, "everything published after the restart", func() (bool, error) {
		c, err := publishedCount(ctx, pool)
		return c == 600, err
	})
	seen := map[int64]map[int32]int{}
	for _, m := range streamMsgs(t, js) {
		if seen[m.body.ItemID] == nil {
			seen[m.body.ItemID] = map[int32]int{}
		}
		seen[m.body.ItemID][m.body.Dispatch]++
	}
	if len(seen) != 600 {
		t.Fatalf("stream holds %d distinct items, want 600", len(seen))
	}
	for id, ds := range seen {
		for d, c := range ds {
			if c != 1 {
				t.Errorf("item %d dispatch %d held %d times", id, d, c)
			}
		}
	}
}

// The stream purged right after publishing: nothing happens before the
// re-dispatch interval (by the database clock), then every affected row gets
// dispatch 2 — exactly 2, though two relays sweep at once — and is published
// again under a new Nats-Msg-Id, once.
func TestPurgedStreamIsRedispatchedAfterInterval(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	srv := natstest.New(t)
	nc, js := connect(t, srv)
	_, jsB := connect(t, srv)
	ctx := context.Background()
	w := tap(t, nc)
	clk := clock.NewManual(time.Now().Add(time.Hour)) // ahead of the rows' next_attempt_at
	sweeps := make(chan int, 1024)
	cfg := testConfig()
	regA, regB := prometheus.NewRegistry(), prometheus.NewRegistry()
	start(t, pool, js, cfg, WithClock(clk), WithRegistry(regA), withHooks(hooks{afterSweep: func(n int) {
		select {
		case sweeps <- n:
		default:
		}
	}}))
	start(t, pool, jsB, cfg, WithClock(clk), WithRegistry(regB))
	ids := stage(t, pool, items("org_p", 0, 50)...)
	eventually(t, "first publication", func() (bool, error) {
		c, err := publishedCount(ctx, pool)
		return c == len(ids), err
	})
	s, err := js.Stream(ctx, outbox.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Purge(ctx); err != nil {
		t.Fatal(err)
	}

	// Just short of the interval: sweeps run, nothing is re-dispatched.
	clk.Advance(time.Duration(cfg.RedispatchSeconds)*time.Second - time.Second)
	drain(sweeps)
	for i := 0; i < 3; i++ {
		if n := <-sweeps; n != 0 {
			t.Fatalf("sweep before the interval bumped %d rows", n)
		}
	}
	if n, _ := streamCount(js); n != 0 {
		t.Fatalf("stream holds %d messages before the interval, want 0", n)
	}

	clk.Advance(2 * time.Second)
	eventually(t, "re-dispatched and published again", func() (bool, error) {
		var c int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_items WHERE published_dispatch = dispatch AND dispatch >= 2`).Scan(&c)
		return c == len(ids), err
	})
	drain(sweeps)
	<-sweeps // later sweeps find nothing more to bump
	<-sweeps
	var maxDispatch int
	if err := pool.QueryRow(ctx, `SELECT max(dispatch) FROM outbox_items`).Scan(&maxDispatch); err != nil || maxDispatch != 2 {
		t.Fatalf("max dispatch %d (err %v), want 2: one bump per lost generation", maxDispatch, err)
	}
	msgs := streamMsgs(t, js)
	if len(msgs) != len(ids) {
		t.Fatalf("stream holds %d messages after re-dispatch, want %d", len(msgs), len(ids))
	}
	for _, m := range msgs {
		if m.body.Dispatch != 2 || m.msgID != outbox.MsgID(m.body.Key, 2) {
			t.Errorf("item %d: dispatch %d msg id %s, want dispatch 2", m.body.ItemID, m.body.Dispatch, m.msgID)
		}
	}
	byID, total := w.snapshot()
	if total != 2*len(ids) || len(byID) != 2*len(ids) {
		t.Fatalf("wire saw %d publishes of %d ids, want %d of %d (dispatch 1 and 2 of each row, once each)", total, len(byID), 2*len(ids), 2*len(ids))
	}
	a, _ := counterValue(regA, "aurora_relay_redispatched_total")
	b, _ := counterValue(regB, "aurora_relay_redispatched_total")
	if a+b != float64(len(ids)) {
		t.Fatalf("redispatched_total %v + %v, want %d", a, b, len(ids))
	}
}

func drain(c chan int) {
	for {
		select {
		case <-c:
		default:
			return
		}
	}
}

// counterValue reads a counter (summed over labels) from reg.
func counterValue(reg *prometheus.Registry, name string) (float64, error) {
	mfs, err := reg.Gather()
	if err != nil {
		return 0, err
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		var sum float64
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue()
		}
		return sum, nil
	}
	return 0, fmt.Errorf("metric %s not found", name)
}
