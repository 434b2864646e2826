package events

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Two consumers of one type, one stopped while events are dispatched: both
// process every event exactly once (one inbox row each), and the outbox
// rows end acknowledged only after both.
func TestTwoConsumersOneStopped(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.effectsTable()
	cfg := testConfig()
	run(t, e.dispatcher(cfg).Run)
	c := e.client(cfg)
	types := []string{"InvoicePaid.v1"}

	run(t, func(ctx context.Context) error { return c.Consume(ctx, "ledger", types, recordEffect("ledger")) })
	stopB := run(t, func(ctx context.Context) error { return c.Consume(ctx, "crm", types, recordEffect("crm")) })
	eventually(t, 10*time.Second, "both consumers registered", func() bool {
		return e.count(`SELECT count(*) FROM event_consumers`) == 2
	})
	stopB() // crm is down from here on

	ids := e.publish("InvoicePaid.v1", 50)
	eventually(t, 15*time.Second, "ledger processed all 50", func() bool {
		return e.count(`SELECT count(*) FROM event_inbox WHERE consumer = 'ledger' AND status = 'processed'`) == 50
	})
	if n := e.count(`SELECT count(*) FROM event_outbox WHERE status = 'acknowledged'`); n != 0 {
		t.Fatalf("%d events acknowledged while crm has processed none", n)
	}
	if n := e.count(`SELECT count(*) FROM event_outbox WHERE status = 'dispatched'`); n != 50 {
		t.Fatalf("dispatched = %d, want 50 (waiting for crm)", n)
	}

	run(t, func(ctx context.Context) error { return c.Consume(ctx, "crm", types, recordEffect("crm")) })
	eventually(t, 15*time.Second, "all 50 acknowledged after crm caught up", func() bool {
		return e.count(`SELECT count(*) FROM event_outbox WHERE status = 'acknowledged'`) == 50
	})
	for _, consumer := range []string{"ledger", "crm"} {
		if n := e.count(`SELECT count(*) FROM effects WHERE consumer = $1`, consumer); n != 50 {
			t.Errorf("%s: %d side effects, want 50", consumer, n)
		}
		if n := e.count(`SELECT count(DISTINCT event_id) FROM effects WHERE consumer = $1 AND event_id = ANY ($2::uuid[])`, consumer, ids); n != 50 {
			t.Errorf("%s: %d distinct events, want 50", consumer, n)
		}
		if n := e.count(`SELECT count(*) FROM event_inbox WHERE consumer = $1`, consumer); n != 50 {
			t.Errorf("%s: %d inbox rows, want 50", consumer, n)
		}
	}
	// acknowledged only after both: no event's acknowledgement precedes
	// either consumer's processing of it
	if n := e.count(`SELECT count(*) FROM event_outbox o JOIN event_inbox i USING (event_id)
		WHERE o.acknowledged_at < i.processed_at`); n != 0 {
		t.Errorf("%d events acknowledged before a consumer processed them", n)
	}
}

// The same event delivered twice — real-time and catch-up, and two replicas
// of one consumer at once — has one side effect; the second delivery is a
// duplicate, with no error log.
func TestSameEventDeliveredTwice(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.effectsTable()
	cfg := testConfig()
	cfg.ConsumerIntervalMS = 100 // catch-up races the real-time path
	run(t, e.dispatcher(cfg).Run)
	types := []string{"SubscriptionChanged.v1"}

	// two replicas of one consumer (two Clients = two processes), both
	// with real-time and catch-up; the handler is slow so the paths overlap
	slow := func(ctx context.Context, tx pgx.Tx, d Delivery) error {
		time.Sleep(5 * time.Millisecond)
		return recordEffect("billing")(ctx, tx, d)
	}
	for range 2 {
		c := e.client(cfg)
		run(t, func(ctx context.Context) error { return c.Consume(ctx, "billing", types, slow) })
	}
	eventually(t, 10*time.Second, "consumer registered", func() bool {
		return e.count(`SELECT count(*) FROM event_consumers`) == 1
	})
	ids := e.publish("SubscriptionChanged.v1", 40)
	eventually(t, 20*time.Second, "all 40 acknowledged", func() bool {
		return e.count(`SELECT count(*) FROM event_outbox WHERE status = 'acknowledged'`) == 40
	})
	// force a second delivery of every event through both paths at once
	var wg sync.WaitGroup
	c1, c2 := e.client(cfg), e.client(cfg)
	w1 := &worker{c: c1, name: "billing", types: types, h: slow, log: e.log}
	w2 := &worker{c: c2, name: "billing", types: types, h: slow, log: e.log}
	dups := make([]int, 2)
	for i, w := range []*worker{w1, w2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, id := range ids {
				o, _, err := w.process(context.Background(), id, SourceCatchUp, nil)
				if err != nil {
					t.Errorf("process: %v", err)
					return
				}
				if o != outDuplicate {
					t.Errorf("redelivery of a processed event: outcome %d, want duplicate", o)
				}
				dups[i]++
			}
		}()
	}
	wg.Wait()
	if n := e.count(`SELECT count(*) FROM effects`); n != 40 {
		t.Fatalf("side effects = %d, want 40 (one per event)", n)
	}
	if n := e.count(`SELECT count(*) FROM event_inbox`); n != 40 {
		t.Fatalf("inbox rows = %d, want 40", n)
	}
	if n := e.count(`SELECT coalesce(sum(duplicate_deliveries), 0) FROM event_inbox`); n < 80 {
		t.Errorf("duplicate_deliveries = %d, want at least the 80 forced redeliveries", n)
	}
	if bad := e.logs.atLeast(slog.LevelWarn); len(bad) > 0 {
		t.Errorf("warnings or errors logged: %q", bad)
	}
}

// Two replicas claiming the same new event at the same instant: the second
// INSERT waits for the first and fails on event_inbox_pkey — a duplicate,
// one side effect.
func TestConcurrentClaimIsDuplicate(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.effectsTable()
	cfg := testConfig()
	d := e.dispatcher(cfg)
	if _, err := EnsureStream(context.Background(), e.js, cfg); err != nil {
		t.Fatal(err)
	}
	ids := e.publish("InvoicePaid.v1", 1)
	if _, err := d.DispatchOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(context.Background(), sqlRegisterConsumer, "ledger", []string{"InvoicePaid.v1"}); err != nil {
		t.Fatal(err)
	}
	entered := make(chan struct{})
	release := make(chan struct{})
	first := func(ctx context.Context, tx pgx.Tx, d Delivery) error {
		close(entered)
		<-release
		return recordEffect("ledger")(ctx, tx, d)
	}
	c := e.client(cfg)
	w1 := &worker{c: c, name: "ledger", types: []string{"InvoicePaid.v1"}, h: first, log: e.log}
	w2 := &worker{c: c, name: "ledger", types: []string{"InvoicePaid.v1"}, h: recordEffect("ledger"), log: e.log}
	res := make(chan outcome, 2)
	go func() { o, _, _ := w1.process(context.Background(), ids[0], SourceRealtime, nil); res <- o }()
	<-entered
	go func() { o, _, _ := w2.process(context.Background(), ids[0], SourceCatchUp, nil); res <- o }()
	time.Sleep(50 * time.Millisecond) // w2 is now blocked on w1's uncommitted inbox row
	close(release)
	got := map[outcome]int{<-res: 1}
	got[<-res]++
	if got[outProcessed] != 1 || got[outDuplicate] != 1 {
		t.Fatalf("outcomes %v, want one processed and one duplicate", got)
	}
	if n := e.count(`SELECT count(*) FROM effects`); n != 1 {
		t.Fatalf("side effects = %d, want 1", n)
	}
}

// A handler failing with a foreign-key violation is retried, then
// dead-lettered — never recorded as duplicate — and the events after it are
// processed within two catch-up intervals.
func TestPoisonForeignKeyDeadLettered(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `CREATE TABLE accounts (code text PRIMARY KEY);
		INSERT INTO accounts VALUES ('1010');
		CREATE TABLE postings (event_id uuid PRIMARY KEY, account text NOT NULL REFERENCES accounts (code))`); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig()
	cfg.ConsumerIntervalMS = 500 // a pass of 11 events takes up to ~400 ms under -race at load 17
	run(t, e.dispatcher(cfg).Run)
	types := []string{"InvoicePaid.v1"}
	// the payload names the account; "9999" does not exist
	post := func(ctx context.Context, tx pgx.Tx, d Delivery) error {
		_, err := tx.Exec(ctx, `INSERT INTO postings (event_id, account) VALUES ($1, $2::jsonb->>'account')`, d.ID, string(d.Payload))
		return err
	}
	c := e.client(cfg)
	// register first, so no event is acknowledged without this consumer
	if _, err := e.pool.Exec(ctx, sqlRegisterConsumer, "ledger", types); err != nil {
		t.Fatal(err)
	}
	pub := func(account string) string {
		tx, _ := e.pool.Begin(ctx)
		id, err := Publish(ctx, tx, Event{Type: "InvoicePaid.v1", AggregateID: "in_1", Payload: []byte(`{"account":"` + account + `"}`)})
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		return id
	}
	poison := pub("9999")
	var good []string
	for range 10 {
		good = append(good, pub("1010"))
	}
	eventually(t, 10*time.Second, "all dispatched", func() bool {
		return e.count(`SELECT count(*) FROM event_outbox WHERE status = 'dispatched'`) == 11
	})
	// real-time off: only the catch-up loop delivers, so its progress past
	// the poison event is what is measured
	start := time.Now()
	w := &worker{c: c, name: "ledger", types: types, h: post, log: e.log}
	stop := run(t, func(ctx context.Context) error { w.catchUpLoop(ctx); return nil })
	eventually(t, 2*cfg.consumerInterval(), "the 10 events after the poison processed within two catch-up intervals", func() bool {
		return e.count(`SELECT count(*) FROM event_inbox WHERE consumer = 'ledger' AND status = 'processed'`) == 10
	})
	t.Logf("10 good events processed %s after the catch-up loop started (interval %s)", time.Since(start).Round(time.Millisecond), cfg.consumerInterval())
	eventually(t, 10*time.Second, "poison dead-lettered", func() bool {
		return e.count(`SELECT count(*) FROM event_inbox WHERE event_id = $1 AND dead_lettered_at IS NOT NULL`, poison) == 1
	})
	stop()
	var attempts int
	var status, reason, lastErr string
	if err := e.pool.QueryRow(ctx, `SELECT status, attempts, dead_letter_reason, last_error FROM event_inbox WHERE event_id = $1`, poison).
		Scan(&status, &attempts, &reason, &lastErr); err != nil {
		t.Fatal(err)
	}
	if status != string(InboxFailed) || attempts != cfg.ConsumerMaxAttempts || reason != string(ReasonHandlerExhausted) {
		t.Fatalf("poison inbox row: status %s attempts %d reason %s; want failed, %d, handler_exhausted", status, attempts, reason, cfg.ConsumerMaxAttempts)
	}
	if !contains(lastErr, "23503") {
		t.Errorf("last_error %q does not carry the foreign-key violation", lastErr)
	}
	// the only consumer dead-lettered it: the outbox row is dead_letter, the
	// good ones acknowledged
	st := e.statuses()
	if st[StatusDeadLetter] != 1 || st[StatusAcknowledged] != 10 {
		t.Fatalf("outbox statuses %v, want 1 dead_letter and 10 acknowledged", st)
	}
	// operator requeue after fixing the cause: processed on the next pass
	if _, err := e.pool.Exec(ctx, `INSERT INTO accounts VALUES ('9999')`); err != nil {
		t.Fatal(err)
	}
	if _, err := Requeue(ctx, e.pool, nil, RequeueRequest{EventID: poison, Consumer: "ledger", Operator: "ops@example", Reason: "account 9999 created"}, true); err != nil {
		t.Fatal(err)
	}
	res, err := c.CatchUpOnce(ctx, "ledger", types, post)
	if err != nil || res.Processed != 1 {
		t.Fatalf("catch-up after requeue: %+v, %v; want 1 processed", res, err)
	}
	if st := e.statuses(); st[StatusAcknowledged] != 11 {
		t.Fatalf("statuses after requeue %v, want 11 acknowledged", st)
	}
	_ = good
}

func contains(s, sub string) bool {
	return len(sub) == 0 || (len(s) >= len(sub) && (s == sub || indexOf(s, sub) >= 0))
}

func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}

var _ = errors.Is
