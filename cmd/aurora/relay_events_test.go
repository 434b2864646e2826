package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/shared/events"
	"github.com/aurora-billing/aurora/shared/natstest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
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

// The relay's /readyz reports the domain-event dispatcher: on a NATS server
// without JetStream (Postgres up, NATS connected) it answers 503 "not
// ready: events_dispatcher" — it answered ready before, though nothing was
// dispatched — and on one with JetStream it answers 200 once the
// dispatcher runs.
func TestRelayReadyzReportsTheEventDispatcher(t *testing.T) {
	plain, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go plain.Start()
	t.Cleanup(plain.Shutdown)
	if !plain.ReadyForConnections(10 * time.Second) {
		t.Fatal("plain NATS server not ready")
	}
	dbURL := dbtest.NewDatabase(t)
	for _, tc := range []struct {
		name, nats string
		code       int
		body       string
	}{
		{"without JetStream", plain.ClientURL(), http.StatusServiceUnavailable, "not ready: events_dispatcher\n"},
		{"with JetStream", natstest.New(t).URL(), http.StatusOK, "ready\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := freeAddr(t)
			t.Setenv("AURORA_DATABASE_URL", dbURL)
			t.Setenv("AURORA_NATS_URL", tc.nats)
			t.Setenv("AURORA_RELAY_HTTP_ADDR", addr)
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan int, 1)
			go func() { done <- run(ctx, []string{"relay"}) }()
			defer func() {
				cancel()
				select {
				case <-done:
				case <-time.After(30 * time.Second):
					t.Error("aurora relay did not stop")
				}
			}()
			var last string
			deadline := time.Now().Add(30 * time.Second)
			for {
				code, body := httpGet(t, "http://"+addr+"/readyz")
				last = fmt.Sprintf("%d %q", code, body)
				if code == tc.code && body == tc.body {
					break
				}
				select {
				case c := <-done:
					t.Fatalf("aurora relay exited %d; /readyz last answered %s", c, last)
				default:
				}
				if time.Now().After(deadline) {
					t.Fatalf("/readyz answered %s, want %d %q", last, tc.code, tc.body)
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
}

// freeAddr returns a 127.0.0.1 address whose port was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// httpGet returns the status and body of GET url, or 0 while nothing
// answers.
func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	c := http.Client{Timeout: 3 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
