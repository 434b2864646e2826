package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/aurora-billing/aurora/internal/syncbuf"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/inbox"
	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/shared/events"
	"github.com/aurora-billing/aurora/shared/natstest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestChartValidate(t *testing.T) {
	for _, tc := range []struct {
		chart ChartOfAccounts
		ok    bool
	}{
		{DefaultChart(), true},
		{ChartOfAccounts{Debit: "1100", Credit: "4000"}, true},
		{ChartOfAccounts{Debit: "1010", Credit: "1010"}, false},
		{ChartOfAccounts{Debit: "", Credit: "2010"}, false},
		{ChartOfAccounts{Debit: "10 10", Credit: "2010"}, false},
	} {
		err := tc.chart.Validate()
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrInvalidChart)) {
			t.Errorf("%+v: %v", tc.chart, err)
		}
	}
	if DefaultChart() != (ChartOfAccounts{Debit: "1010", Credit: "2010"}) {
		t.Fatal("the default chart is not debit 1010 / credit 2010")
	}
}

func TestRunRefusesBadFlags(t *testing.T) {
	for _, args := range [][]string{{"--debit", "2010"}, {"--credit", "a b"}, {"--consumer", "Bad Name"}, {"--nope"}} {
		var stderr bytes.Buffer
		if code := run(context.Background(), args, &stderr); code != 2 {
			t.Errorf("%v: exit %d, want 2 (%s)", args, code, stderr.String())
		}
	}
}

type testEnv struct {
	url  string
	pool *pgxpool.Pool
	js   jetstream.JetStream
	nats string
}

func newTestEnv(t *testing.T) *testEnv {
	t.Helper()
	url := dbtest.NewDatabase(t)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	srv := natstest.New(t)
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return &testEnv{url: url, pool: pool, js: js, nats: srv.URL()}
}

func testConfig() events.Config {
	c := events.DefaultConfig()
	c.ConsumerIntervalMS = 200
	c.DispatchPollMS = 20
	c.ConsumerBackoffBaseMS = 10
	c.ConsumerBackoffCapMS = 40
	c.ConsumerMaxAttempts = 3
	c.ConsumerMaxDeliver = 10
	return c
}

// publish commits InvoicePaid.v1 for invoice inv (the inbox's payload).
func (e *testEnv) publish(t *testing.T, inv string, amount int64) string {
	t.Helper()
	body, _ := json.Marshal(inbox.InvoiceOutcome{Tenant: "tenant_1", InvoiceID: inv, SubscriptionID: "sub_1", Amount: &amount,
		Currency: "eur", StripeEventID: "evt_" + inv, StripeEventCreated: time.Unix(1_750_000_000, 0).UTC()})
	var id string
	err := pgx.BeginFunc(context.Background(), e.pool, func(tx pgx.Tx) error {
		var err error
		id, err = events.Publish(context.Background(), tx, events.Event{ID: events.IDFor("test", inv), Type: inbox.EventInvoicePaid, AggregateID: inv, Payload: body})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func (e *testEnv) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Two replicas of the ledger deliver the same events at once: the second
// claim of an event waits on the first's uncommitted inbox row and, once
// it commits, is a duplicate: one balanced posting per event. Then the
// runnable example, `ledger --debit 1100 --credit 4000`, consumes events
// committed while it runs (real-time and catch-up racing each other).
func TestLedgerPostsEachInvoicePaidOnce(t *testing.T) {
	e := newTestEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := testConfig()
	d, err := events.NewDispatcher(e.pool, e.js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = d.Run(ctx) }()
	if err := EnsureSchema(ctx, e.pool); err != nil {
		t.Fatal(err)
	}
	chart := ChartOfAccounts{Debit: "1100", Credit: "4000"}
	l, err := New(chart)
	if err != nil {
		t.Fatal(err)
	}
	types := []string{inbox.EventInvoicePaid}
	replicaA, err := events.NewClient(e.pool, e.js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	replicaB, err := events.NewClient(e.pool, e.js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// register the consumer before anything is published
	if _, err := replicaA.CatchUpOnce(ctx, "ledger", types, l.Handle); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		e.publish(t, fmt.Sprintf("in_%d", i), int64(1000+i))
	}
	eventually(t, 20*time.Second, "5 events dispatched", func() bool {
		return e.count(t, `SELECT count(*) FROM event_outbox WHERE status = 'dispatched'`) == 5
	})

	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	gated := func(ctx context.Context, tx pgx.Tx, d events.Delivery) error {
		once.Do(func() { close(entered); <-release })
		return l.Handle(ctx, tx, d)
	}
	var resA, resB events.CatchUpResult
	var errA, errB error
	var rwg sync.WaitGroup
	rwg.Add(2)
	go func() { defer rwg.Done(); resA, errA = replicaA.CatchUpOnce(ctx, "ledger", types, gated) }()
	<-entered // A holds the first event's inbox claim, uncommitted
	go func() { defer rwg.Done(); resB, errB = replicaB.CatchUpOnce(ctx, "ledger", types, l.Handle) }()
	eventually(t, 10*time.Second, "replica B waiting on A's inbox row", func() bool {
		return e.count(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`) >= 1
	})
	close(release)
	rwg.Wait()
	if errA != nil || errB != nil {
		t.Fatalf("catch-up: %v / %v", errA, errB)
	}
	if resA.Processed+resB.Processed != 5 || resB.Duplicates < 1 || resA.Errors+resB.Errors != 0 {
		t.Fatalf("replica A %+v, replica B %+v; want 5 processed between them and B's first claim a duplicate", resA, resB)
	}
	check := func(when string, n int) {
		t.Helper()
		if got := e.count(t, `SELECT count(*) FROM ledger_entries`); got != n {
			t.Fatalf("%s: %d entries, want %d", when, got, n)
		}
		if got := e.count(t, `SELECT count(*) FROM ledger_lines`); got != 2*n {
			t.Fatalf("%s: %d lines, want %d", when, got, 2*n)
		}
		if got := e.count(t, `SELECT count(*) FROM (SELECT event_id FROM ledger_lines GROUP BY event_id
			HAVING sum(CASE side WHEN 'debit' THEN amount ELSE -amount END) <> 0) unbalanced`); got != 0 {
			t.Fatalf("%s: %d unbalanced entries", when, got)
		}
		if got := e.count(t, `SELECT count(*) FROM ledger_lines WHERE (side = 'debit' AND account = '1100') OR (side = 'credit' AND account = '4000')`); got != 2*n {
			t.Fatalf("%s: %d lines on the configured accounts, want %d", when, got, 2*n)
		}
		if got := e.count(t, `SELECT count(*) FROM ledger_entries e JOIN event_outbox o USING (event_id)
			WHERE e.amount = (o.payload->>'amount')::bigint AND e.invoice_id = o.aggregate_id AND o.status = 'acknowledged'`); got != n {
			t.Fatalf("%s: %d acknowledged entries match their event's amount and invoice, want %d", when, got, n)
		}
		if got := e.count(t, `SELECT count(*) FROM event_inbox WHERE consumer = 'ledger' AND status = 'processed'`); got != n {
			t.Fatalf("%s: %d processed inbox rows, want %d", when, got, n)
		}
	}
	check("after two replicas delivered every event", 5)

	// the runnable example
	t.Setenv("AURORA_DATABASE_URL", e.url)
	t.Setenv("AURORA_NATS_URL", e.nats)
	t.Setenv("AURORA_EVENTS_CONSUMER_INTERVAL_MS", "100") // catch-up races real-time
	var stderr bytes.Buffer
	var mu sync.Mutex
	exit := -1
	rctx, stop := context.WithCancel(ctx)
	wg.Add(1)
	go func() {
		defer wg.Done()
		code := run(rctx, []string{"--debit", "1100", "--credit", "4000"}, &lockedWriter{mu: &mu, w: &stderr})
		mu.Lock()
		exit = code
		mu.Unlock()
	}()
	eventually(t, 20*time.Second, "the example attached its durable consumer", func() bool {
		_, err := e.js.Consumer(ctx, events.StreamName, "ledger")
		return err == nil
	})
	for i := 5; i < 10; i++ {
		e.publish(t, fmt.Sprintf("in_%d", i), int64(1000+i))
	}
	eventually(t, 20*time.Second, "10 events acknowledged", func() bool {
		return e.count(t, `SELECT count(*) FROM event_outbox WHERE status = 'acknowledged'`) == 10
	})
	check("after the example consumed", 10)
	stop()
	cancel()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if exit != 0 {
		t.Fatalf("exit %d after a graceful stop\n%s", exit, stderr.String())
	}
}

// A payload the ledger cannot post fails the handler (retried, then
// dead-lettered, never dropped); a zero amount posts nothing.
func TestLedgerRefusesUnpostablePayloads(t *testing.T) {
	e := newTestEnv(t)
	ctx := context.Background()
	if err := EnsureSchema(ctx, e.pool); err != nil {
		t.Fatal(err)
	}
	if err := EnsureSchema(ctx, e.pool); err != nil { // idempotent
		t.Fatal(err)
	}
	l, err := New(DefaultChart())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, payload string
		wantErr       bool
	}{
		{"no amount", `{"tenant":"t","invoice_id":"in_1","currency":"eur"}`, true},
		{"no currency", `{"tenant":"t","invoice_id":"in_1","amount":5}`, true},
		{"negative", `{"tenant":"t","invoice_id":"in_1","amount":-5,"currency":"eur"}`, true},
		{"no invoice", `{"tenant":"t","amount":5,"currency":"eur"}`, true},
		{"zero", `{"tenant":"t","invoice_id":"in_1","amount":0,"currency":"eur"}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tx, err := e.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx) //nolint:errcheck
			err = l.Handle(ctx, tx, events.Delivery{Event: events.Event{ID: events.NewID(), Type: inbox.EventInvoicePaid, AggregateID: "in_1",
				Payload: json.RawMessage(tc.payload)}})
			if tc.wantErr != (err != nil) || (err != nil && !errors.Is(err, ErrInvalidPayload)) {
				t.Fatalf("err %v, want error %v (ErrInvalidPayload)", err, tc.wantErr)
			}
			var n int
			_ = tx.QueryRow(ctx, `SELECT count(*) FROM ledger_entries`).Scan(&n)
			if n != 0 {
				t.Fatalf("%d entries posted", n)
			}
		})
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// A ledger started while its database is unreachable waits for it instead
// of exiting (a start beside a restarting Postgres), and stops cleanly.
func TestRunWaitsForAnUnreachableDatabase(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	t.Setenv("AURORA_DATABASE_URL", "postgres://postgres@"+addr+"/test?connect_timeout=1")
	t.Setenv("AURORA_NATS_URL", natstest.New(t).URL())
	ctx, cancel := context.WithCancel(context.Background())
	var stderr syncbuf.Buffer
	done := make(chan int, 1)
	go func() { done <- run(ctx, nil, &stderr) }()
	select {
	case code := <-done:
		t.Fatalf("run exited %d with the database unreachable; want it waiting (%s)", code, stderr.String())
	case <-time.After(1500 * time.Millisecond):
	}
	if !strings.Contains(stderr.String(), "database not reachable yet") {
		t.Fatalf("no retry logged: %s", stderr.String())
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit %d after the stop, want 0 (%s)", code, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not stop")
	}
}
