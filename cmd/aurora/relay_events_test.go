package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/shared/events"
	"github.com/aurora-billing/aurora/shared/natstest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// `aurora relay` runs the domain-event dispatcher: with the polling
// fallback set far beyond the test, an event committed while the relay
// runs reaches AURORA_EVENTS through the NOTIFY wake alone; an event that
// becomes due later (no NOTIFY at that instant) is found by the polling
// fallback once the poll is short.
func TestRelayCommandDispatchesDomainEvents(t *testing.T) {
	dbURL := dbtest.NewDatabase(t)
	srv := natstest.New(t)
	t.Setenv("AURORA_DATABASE_URL", dbURL)
	t.Setenv("AURORA_NATS_URL", srv.URL())
	t.Setenv("AURORA_RELAY_HTTP_ADDR", "127.0.0.1:0")

	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}

	publish := func(aggregate string) string {
		t.Helper()
		var id string
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			id, err = events.Publish(ctx, tx, events.Event{Type: "InvoicePaid.v1", AggregateID: aggregate, Payload: json.RawMessage(`{"amount":1}`)})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	status := func(id string) string {
		var s string
		if err := pool.QueryRow(ctx, `SELECT status FROM event_outbox WHERE event_id = $1`, id).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	waitDispatched := func(id string, within time.Duration) {
		t.Helper()
		deadline := time.Now().Add(within)
		for status(id) != string(events.StatusDispatched) {
			if time.Now().After(deadline) {
				t.Fatalf("event %s is %s after %s, want dispatched", id, status(id), within)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	runRelayCmd := func() (stop func()) {
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan int, 1)
		go func() { done <- run(rctx, []string{"relay"}) }()
		return func() {
			cancel()
			select {
			case code := <-done:
				if code != 0 {
					t.Fatalf("exit %d after graceful stop, want 0", code)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("aurora relay did not stop")
			}
		}
	}

	// 1. NOTIFY wake: the poll (60 s) never fires during the test.
	t.Setenv("AURORA_EVENTS_DISPATCH_POLL_MS", "60000")
	before := publish("inv_before") // committed before the relay starts: the start-up pass takes it
	stop := runRelayCmd()
	waitDispatched(before, 20*time.Second)
	live := publish("inv_live") // committed while the relay runs: only NOTIFY wakes it
	waitDispatched(live, 10*time.Second)

	s, err := js.Stream(ctx, events.StreamName)
	if err != nil {
		t.Fatalf("AURORA_EVENTS not created by the relay: %v", err)
	}
	msg, err := s.GetLastMsgForSubject(ctx, events.Subject("InvoicePaid.v1"))
	if err != nil {
		t.Fatal(err)
	}
	if got := msg.Header.Get(jetstream.MsgIDHeader); got != live {
		t.Fatalf("last message's Nats-Msg-Id %q, want the event id %s", got, live)
	}

	// 2. Polling fallback: a row made due after its NOTIFY (the insert's
	// NOTIFY found it not yet due) is taken by the poll alone.
	stop()
	t.Setenv("AURORA_EVENTS_DISPATCH_POLL_MS", "50")
	stop = runRelayCmd()
	defer stop()
	deferred := publish("inv_deferred")
	// the start-up pass may already have taken it; push it back to pending
	// and due in the near future, with no insert (so no NOTIFY) afterwards
	if _, err := pool.Exec(ctx, `UPDATE event_outbox SET status = 'pending', lease_expires_at = NULL, dispatched_at = NULL,
		stream_seq = NULL, next_attempt_at = now() + interval '300 milliseconds' WHERE event_id = $1`, deferred); err != nil {
		t.Fatal(err)
	}
	waitDispatched(deferred, 10*time.Second)
}

func TestRelayValidateRefusesEventKnobsOutOfRange(t *testing.T) {
	for _, tc := range []struct{ name, key, val string }{
		{"dispatch poll too short", "AURORA_EVENTS_DISPATCH_POLL_MS", "1"},
		{"dispatch batch too large", "AURORA_EVENTS_DISPATCH_BATCH_SIZE", "5000"},
		{"dispatch attempts zero", "AURORA_EVENTS_DISPATCH_MAX_ATTEMPTS", "0"},
		{"retention not above stream age", "AURORA_EVENTS_RETENTION_HOURS", "24"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(tc.key, tc.val)
			if got := run(context.Background(), []string{"relay", "--validate"}); got != 2 {
				t.Fatalf("exit %d, want 2", got)
			}
		})
	}
}
