package events

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/shared/clock"
	"github.com/nats-io/nats.go/jetstream"
)

// An event rolled back with its transaction is never dispatched; a
// committed one reaches aurora.events.<Type> with Nats-Msg-Id = its id.
func TestPublishInTransaction(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	cfg := testConfig()
	tx, _ := e.pool.Begin(ctx)
	if _, err := Publish(ctx, tx, Event{Type: "InvoicePaid.v1", AggregateID: "in_rolled_back", Payload: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback(ctx)
	ids := e.publish("InvoicePaid.v1", 3)
	// a duplicate id: ErrDuplicateEvent, and the transaction stays usable
	tx, _ = e.pool.Begin(ctx)
	_, err := Publish(ctx, tx, Event{ID: ids[0], Type: "InvoicePaid.v1", AggregateID: "x", Payload: json.RawMessage(`{}`)})
	if !errors.Is(err, ErrDuplicateEvent) {
		t.Fatalf("Publish of a stored id = %v, want ErrDuplicateEvent", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("transaction unusable after a duplicate: %v", err)
	}
	run(t, e.dispatcher(cfg).Run)
	eventually(t, 10*time.Second, "3 dispatched", func() bool {
		return e.count(`SELECT count(*) FROM event_outbox WHERE status = 'dispatched' AND stream_seq IS NOT NULL`) == 3
	})
	if n := e.count(`SELECT count(*) FROM event_outbox`); n != 3 {
		t.Fatalf("outbox rows = %d, want 3 (the rolled-back event is not there)", n)
	}
	s, err := e.js.Stream(ctx, StreamName)
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range ids {
		m, err := s.GetMsg(ctx, uint64(i+1))
		if err != nil {
			t.Fatal(err)
		}
		if m.Subject != "aurora.events.InvoicePaid.v1" || m.Header.Get(jetstream.MsgIDHeader) != id {
			t.Errorf("message %d: subject %s msg-id %s, want aurora.events.InvoicePaid.v1 and %s", i+1, m.Subject, m.Header.Get(jetstream.MsgIDHeader), id)
		}
		var env envelope
		if err := json.Unmarshal(m.Data, &env); err != nil || env.ID != id || env.Type != "InvoicePaid.v1" {
			t.Errorf("message %d body %s", i+1, m.Data)
		}
	}
}

// A dispatcher killed after the PubAcks and before the marks leaves its
// rows dispatching; after the lease the next dispatcher publishes them
// again and JetStream drops the copies (same Nats-Msg-Id): one message
// each.
func TestDispatcherCrashRepublishDeduped(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	cfg := testConfig()
	if _, err := EnsureStream(ctx, e.js, cfg); err != nil {
		t.Fatal(err)
	}
	ids := e.publish("InvoicePaid.v1", 5)
	clk := clock.NewManual(time.Now().Add(time.Second)) // after the rows' database now()
	crashed := e.dispatcher(cfg, WithClock(clk))
	crashed.afterPublish = func([]string) error { return errors.New("killed") }
	if _, err := crashed.DispatchOnce(ctx); err == nil {
		t.Fatal("the crash hook did not stop the batch")
	}
	if n := e.count(`SELECT count(*) FROM event_outbox WHERE status = 'dispatching'`); n != 5 {
		t.Fatalf("dispatching = %d, want 5", n)
	}
	next := e.dispatcher(cfg, WithClock(clk))
	if n, _ := next.DispatchOnce(ctx); n != 0 {
		t.Fatalf("claimed %d rows under a live lease", n)
	}
	clk.Advance(cfg.dispatchLease() + time.Second)
	if n, err := next.DispatchOnce(ctx); err != nil || n != 5 {
		t.Fatalf("after the lease: claimed %d, %v; want 5", n, err)
	}
	s, _ := e.js.Stream(ctx, StreamName)
	info, _ := s.Info(ctx)
	if info.State.Msgs != 5 {
		t.Fatalf("stream holds %d messages, want 5 (the republish deduplicated)", info.State.Msgs)
	}
	if n := e.count(`SELECT count(*) FROM event_outbox WHERE status = 'dispatched' AND attempts = 2 AND event_id = ANY ($1::uuid[])`, ids); n != 5 {
		t.Fatalf("dispatched after two attempts = %d, want 5", n)
	}
}

// Publishes that fail (no stream for the subject) are retried with backoff
// and end dead_letter after AURORA_EVENTS_DISPATCH_MAX_ATTEMPTS; an operator
// requeue puts the event back to pending.
func TestDispatchFailuresDeadLetter(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	cfg := testConfig()
	cfg.DispatchMaxAttempts = 3
	cfg.PublishTimeoutMS = 500
	id := e.publish("InvoicePaid.v1", 1)[0]
	clk := clock.NewManual(time.Now().Add(time.Second))
	d := e.dispatcher(cfg, WithClock(clk)) // no stream: every publish fails
	for attempt := 1; attempt <= 3; attempt++ {
		if n, err := d.DispatchOnce(ctx); err != nil || n != 1 {
			t.Fatalf("attempt %d: claimed %d, %v", attempt, n, err)
		}
		if n, _ := d.DispatchOnce(ctx); n != 0 {
			t.Fatalf("attempt %d: retried before its backoff", attempt)
		}
		clk.Advance(time.Minute)
	}
	var status, reason string
	var attempts int
	if err := e.pool.QueryRow(ctx, `SELECT status, last_reason, attempts FROM event_outbox WHERE event_id = $1`, id).Scan(&status, &reason, &attempts); err != nil {
		t.Fatal(err)
	}
	if status != string(StatusDeadLetter) || reason != string(ReasonDispatchExhausted) || attempts != 3 {
		t.Fatalf("after 3 failures: %s %s %d, want dead_letter dispatch_exhausted 3", status, reason, attempts)
	}
	if n, _ := d.DispatchOnce(ctx); n != 0 {
		t.Fatal("a dead letter was claimed again")
	}
	req := RequeueRequest{EventID: id, Operator: "ops@example", Reason: "stream restored"}
	plan, err := Requeue(ctx, e.pool, clk, req, false)
	if err != nil || plan.Applied || len(plan.Changes) != 1 {
		t.Fatalf("dry run: %+v %v", plan, err)
	}
	if st := e.statuses(); st[StatusDeadLetter] != 1 {
		t.Fatal("the dry run changed the row")
	}
	if _, err := Requeue(ctx, e.pool, clk, req, true); err != nil {
		t.Fatal(err)
	}
	if _, err := EnsureStream(ctx, e.js, cfg); err != nil {
		t.Fatal(err)
	}
	if n, err := d.DispatchOnce(ctx); err != nil || n != 1 {
		t.Fatalf("after requeue: claimed %d, %v", n, err)
	}
	if st := e.statuses(); st[StatusDispatched] != 1 {
		t.Fatalf("statuses %v, want dispatched", st)
	}
	// a second requeue is refused, named, and audited
	if _, err := Requeue(ctx, e.pool, clk, req, true); !errors.Is(err, ErrNotDeadLettered) {
		t.Fatalf("requeue of a dispatched event = %v, want ErrNotDeadLettered", err)
	}
	if n := e.count(`SELECT count(*) FROM event_requeues WHERE event_id = $1 AND outcome = 'refused'`, id); n != 1 {
		t.Fatalf("refusals audited = %d, want 1", n)
	}
	if _, err := Requeue(ctx, e.pool, clk, RequeueRequest{EventID: id}, true); !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("requeue without operator = %v, want ErrInvalidRequest", err)
	}
}

// Ready (the relay's /readyz "events_dispatcher") is nil only while Run
// dispatches: not before Run, not while Run still retries the stream with
// NATS down, and not after Run returned.
func TestDispatcherReady(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	d := e.dispatcher(testConfig())
	if err := d.Ready(ctx); !errors.Is(err, ErrDispatcherNotRunning) {
		t.Fatalf("before Run: %v, want ErrDispatcherNotRunning", err)
	}
	e.srv.Stop()
	stop := run(t, d.Run)
	eventually(t, 20*time.Second, "a failed attempt to ensure the stream", func() bool {
		return slices.Contains(e.logs.atLeast(slog.LevelWarn), "events: stream not ensured yet, retrying")
	})
	if err := d.Ready(ctx); !errors.Is(err, ErrDispatcherNotRunning) {
		t.Fatalf("while the stream is not ensured: %v, want ErrDispatcherNotRunning", err)
	}
	e.srv.Restart()
	eventually(t, 30*time.Second, "Ready once NATS is back", func() bool { return d.Ready(ctx) == nil })
	stop()
	if err := d.Ready(ctx); !errors.Is(err, ErrDispatcherNotRunning) {
		t.Fatalf("after Run returned: %v, want ErrDispatcherNotRunning", err)
	}
}
